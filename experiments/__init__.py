"""The papers' experiments: drivers that launch the training scripts and evaluators over a grid of
settings and collect one table (runner.py is what they share), and the download of their inputs."""

"""Hugging Face I/O, written with the standard library and torch only: Hub downloads (hub.py), the
safetensors format (safetensors_io.py), and model folders <-> model.py (models.py: config.json and
tensor names per family, whole-folder load and save)."""

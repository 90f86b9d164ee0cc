"""Plots are an optional extra: matplotlib is imported only here, only when a plot is drawn, and its
absence is a message, never a failure of the run whose numbers the plot shows."""
from pathlib import Path


class MatplotlibMissing(ImportError):
    pass


def pyplot(what="this plot"):
    """matplotlib.pyplot on the file-only Agg backend, or MatplotlibMissing naming what needs it."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise MatplotlibMissing(f"{what} needs matplotlib, an optional extra: pip install matplotlib") from e
    return plt


def pyplot_or_say(redraw):
    """pyplot, or None after saying that no plot was drawn and how to draw it later (`redraw`: the command)."""
    try:
        return pyplot()
    except MatplotlibMissing:
        print("matplotlib is not installed, so no plots were drawn (the results are complete without them). "
              f"To draw them: pip install matplotlib (requirements-dev.txt), then {redraw}")
        return None


def save(fig, path, dpi=130):
    """Lay out, write and close `fig`; returns the path."""
    import matplotlib.pyplot as plt
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return Path(path)

"""The Hydra configs shipped with the package (one folder per config group)."""
from pathlib import Path

CONF_DIR = Path(__file__).resolve().parent

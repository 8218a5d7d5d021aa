"""The harness's Hydra launcher (grouped_launcher), found by Hydra's plugin discovery."""

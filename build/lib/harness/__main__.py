"""`python -m harness task=<t> model=<m> [overrides]` (and `-m` for a Hydra multirun)."""
from harness.run.cli import main

if __name__ == "__main__":
    main()

"""Running a tutorial notebook in a Jupyter kernel of this interpreter (nbclient)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

# Longest a cell may run before the execution is called hung (each notebook as a whole takes under two
# minutes on CPU; the measured times are in the commit that adds them, not asserted here).
CELL_TIMEOUT_S = 300


def execute(nb, jupyter_path: str, cwd: Path, monkeypatch) -> None:
    from nbclient import NotebookClient

    monkeypatch.setenv("JUPYTER_PATH", jupyter_path)
    NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}
    ).execute()


def jupyter_path_in(root: Path) -> str:
    """A JUPYTER_PATH under root whose python3 kernel is this interpreter; nbconvert's templates stay reachable."""
    spec = root / "kernels" / "python3"
    spec.mkdir(parents=True)
    spec.joinpath("kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "Python 3 (headlens tests)",
                "language": "python",
            }
        )
    )
    paths = [str(root)]
    try:
        import nbconvert

        # nbconvert sits in <prefix>/lib/pythonX.Y/site-packages/nbconvert, its templates in <prefix>/share/jupyter
        share = Path(nbconvert.__file__).resolve().parents[4] / "share" / "jupyter"
        if share.is_dir():
            paths.append(str(share))  # the templates of an nbconvert installed in another prefix
    except ImportError:
        pass
    return os.pathsep.join(paths)

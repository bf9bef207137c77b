"""The package's front (`biodistil/__init__.py`) stands above every layer: it may expose anything (`Predictor`), so no
module of the package may import it; `import biodistil` stays light."""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "biodistil"


def _submodules() -> set[str]:
    return {path.stem if path.suffix == ".py" else path.name for path in PACKAGE.iterdir()
            if path.suffix == ".py" or (path / "__init__.py").is_file()}


def test_no_module_imports_the_package_front():
    submodules, found = _submodules(), []
    for path in PACKAGE.rglob("*.py"):
        if path == PACKAGE / "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "biodistil" and node.level == 0:
                found += [f"{path.relative_to(PACKAGE)}: {a.name}" for a in node.names if a.name not in submodules]
            elif isinstance(node, ast.Import):
                found += [f"{path.relative_to(PACKAGE)}: import biodistil" for a in node.names if a.name == "biodistil"]
    assert not found, f"imports of the package front (it imports export): {found}"


def test_import_biodistil_imports_no_torch_and_exposes_predictor():
    code = "import sys, biodistil; assert 'torch' not in sys.modules; print(biodistil.__version__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    import biodistil
    from biodistil import Predictor

    assert done.stdout.strip() == biodistil.__version__ and Predictor.__module__ == "biodistil.export.predict"


def test_the_web_framework_is_imported_only_by_serving():
    """FastAPI, uvicorn, Starlette and prometheus_client (the extra `serve`) are `serving/`'s alone; the CLI reaches
    them only through it, when `serve` runs (imports inside functions count)."""
    framework, found = {"fastapi", "uvicorn", "starlette", "prometheus_client", "httpx"}, []
    for path in PACKAGE.rglob("*.py"):
        if path.relative_to(PACKAGE).parts[0] == "serving":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{path.relative_to(PACKAGE)}: {name}" for name in names if name.split(".")[0] in framework]
    assert not found, f"the web framework imported outside serving/: {found}"

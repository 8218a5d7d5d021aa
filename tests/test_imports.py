"""The package's imports form a DAG that follows its layers (harness.devtools.imports)."""
import ast
import subprocess
import sys
from pathlib import Path

from harness.devtools import imports


def test_no_cycles_and_no_upward_imports():
    g = imports.graph()
    assert len(g) > 50  # the whole package was read
    assert imports.cycles(g) == []
    assert imports.upward(g) == []


def test_the_graph_holds_analysis_and_its_figure_modules_form_no_cycle():
    g = imports.graph()
    assert {"analysis.figures", "analysis.smoke", "analysis.pipeline"} <= set(g)
    assert "analysis.figures" not in g["analysis.smoke"] and "analysis.smoke" in g["analysis.figures"]
    assert imports.layer_of("analysis.figures") == len(imports.LAYERS) - 1


def test_every_module_has_a_layer():
    for name in imports.graph():
        imports.layer_of(name)  # raises KeyError for a module outside LAYERS


def test_a_cycle_and_an_upward_import_are_found():
    g = {"harness.ops.a": {"harness.ops.b"}, "harness.ops.b": {"harness.ops.a"},
         "harness.ops.c": {"harness.train.loop"}, "harness.train.loop": set()}
    assert imports.cycles(g) == [["harness.ops.a", "harness.ops.b"]]
    assert imports.upward(g) == [("harness.ops.c", "harness.train.loop")]


def test_no_module_imports_another_modules_private_name():
    assert imports.private_imports() == []


def test_a_private_import_is_found(tmp_path):
    files = {"harness.run.job": "def _run_claimed():\n    pass\n",
             "harness.run.grouped": "from harness.run.job import _run_claimed\nfrom .job import __doc__\n",
             "harness.run.sweep": "from harness.run.grouped import __doc__\n"}
    mods = {}
    for name, text in files.items():
        mods[name] = tmp_path / f"{name.rsplit('.', 1)[1]}.py"
        mods[name].write_text(text)
    assert imports.private_imports(mods) == [("harness.run.grouped", "harness.run.job._run_claimed")]


def test_from_package_import_module_counts_the_module(tmp_path):
    known = {"harness", "harness.ops", "harness.ops.linear", "harness.layers.kernel"}
    src = tmp_path / "kernel.py"
    src.write_text("from harness import ops\nfrom harness.ops import linear\nfrom . import parts\n")
    assert imports.imports_of("harness.layers.kernel", src, known) == {"harness.ops", "harness.ops.linear"}


def test_the_command_prints_the_layers_in_order():
    out = subprocess.run([sys.executable, "-m", "harness.devtools.imports"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    labels = [line.split()[1] for line in out.stdout.splitlines() if line[:2].strip().isdigit()]
    assert labels[:4] == ["base", "ops", "hooks", "layers"] and labels.index("train") < labels.index("run")


def test_analysis_imports_harness_plainly():
    """Figure code imports harness as any user would: no importlib look-ups with fallbacks."""
    for path in Path(__file__).resolve().parent.parent.joinpath("analysis").rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
        modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "importlib" not in names | modules, path


MAX_FUNCTION_LINES = 80  # a reader holds a function on one screen; a longer one has parts to name


def long_functions(root: Path) -> list[str]:
    """`path:name (n lines)` for every function under root longer than MAX_FUNCTION_LINES."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    found.append(f"{path}:{node.name} ({n} lines)")
    return found


def test_no_function_in_the_package_is_longer_than_a_screen():
    assert long_functions(Path(imports.__file__).resolve().parents[1]) == []


def test_a_long_function_is_found(tmp_path):
    (tmp_path / "m.py").write_text("def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES + "\n\ndef g():\n    pass\n")
    assert long_functions(tmp_path) == [f"{tmp_path / 'm.py'}:f ({MAX_FUNCTION_LINES + 1} lines)"]

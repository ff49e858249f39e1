"""Load the user's application for ``cellactors serve --app``: modules, files or packages.

An app spec is one or several (a comma list) of: a dotted module name, a ``.py`` file, or a
package (a dotted name or a directory holding ``__init__.py``), whose submodules are all
imported. The cell classes served are the :class:`~cellactors.CellActor` subclasses these
modules *define* (imported ones are skipped, so ``from other import Counter`` does not serve
``Counter`` twice), addressed by class name.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pkgutil
import sys
from pathlib import Path
from types import ModuleType

from cellactors.actors.cell import CellActor
from cellactors.core import keys
from cellactors.errors import ConfigError


def _looks_like_path(spec: str) -> bool:
    return spec.endswith(".py") or "/" in spec or "\\" in spec


def split_spec(spec: str) -> list[str]:
    """The parts of a comma list of app specs, blanks dropped."""
    return [part.strip() for part in spec.split(",") if part.strip()]


def absolute_spec(spec: str) -> str:
    """``spec`` with every path made absolute, for a process started elsewhere."""
    return ",".join(
        str(Path(part).resolve()) if _looks_like_path(part) else part for part in split_spec(spec)
    )


def _import_file(path: Path) -> ModuleType:
    """Import a source file (or a package directory) as a module named after it. Its
    directory goes on sys.path (last, so a sibling file never shadows an installed package
    such as uvicorn) so that sibling imports work."""
    package = path.is_dir()
    if package and not (path / "__init__.py").is_file():
        raise ConfigError(f"--app {path}: a directory must be a package (hold __init__.py)")
    if not package and not path.is_file():
        raise ConfigError(f"--app {path}: no such file")
    name = path.resolve().name if package else path.stem
    if not name.isidentifier():
        raise ConfigError(f"--app {path}: the file name must be a valid Python module name")
    if name in sys.modules or name in sys.stdlib_module_names:
        name = f"cellactors_app_{name}"  # never shadow an imported or standard module
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.append(folder)
    spec = importlib.util.spec_from_file_location(
        name,
        path / "__init__.py" if package else path,
        submodule_search_locations=[str(path.resolve())] if package else None,
    )
    if spec is None or spec.loader is None:
        raise ConfigError(f"--app {path}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def load_module(spec: str) -> list[ModuleType]:
    """Import one part of an app spec (``pkg.mod``, ``path/to/file.py``, a package name or
    directory) and, for a package, every submodule; ConfigError on any failure."""
    spec = spec.strip()
    if not spec:
        raise ConfigError("--app is empty; give a module (pkg.mod) or a file (app.py)")
    try:
        if _looks_like_path(spec):
            module = _import_file(Path(spec))
        else:
            if "." not in sys.path and "" not in sys.path:
                sys.path.append("")  # the working directory is importable, last (never shadows)
            module = importlib.import_module(spec)
        path = getattr(module, "__path__", None)
        if path is None:
            return [module]
        found = pkgutil.walk_packages(path, module.__name__ + ".")
        return [module, *(importlib.import_module(info.name) for info in found)]
    except ConfigError:
        raise
    except SystemExit as err:
        raise ConfigError(f"--app {spec}: importing it called sys.exit({err.code!r})") from err
    except Exception as err:
        raise ConfigError(f"--app {spec}: import failed: {type(err).__name__}: {err}") from err


def cell_classes(module: ModuleType) -> list[type[CellActor]]:
    """The CellActor subclasses defined in ``module``, sorted by name."""
    found = [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj)
        and issubclass(obj, CellActor)
        and obj is not CellActor
        and obj.__module__ == module.__name__
        and not inspect.isabstract(obj)
    ]
    return sorted(found, key=lambda c: c.__name__)


def load_app(spec: str) -> list[type[CellActor]]:
    """Import the app (a comma list of modules, files and packages) and return its cell
    classes; ConfigError when there are none, when two share a name, or when a class has
    no public method."""
    modules = [module for part in split_spec(spec) for module in load_module(part)]
    if not modules:
        raise ConfigError("--app is empty; give a module (pkg.mod) or a file (app.py)")
    unique = {module.__name__: module for module in modules}.values()
    classes = sorted(
        (cls for module in unique for cls in cell_classes(module)), key=lambda c: c.__name__
    )
    if not classes:
        raise ConfigError(
            f"--app {spec}: defines no CellActor subclass; "
            "write `class Counter(CellActor): ...` in it"
        )
    names: dict[str, type[CellActor]] = {}
    for cls in classes:
        if cls.__name__ in names:
            raise ConfigError(f"--app {spec}: two cell classes are named {cls.__name__}")
        names[cls.__name__] = cls
        try:
            keys.make_cell_id(cls.__name__, "x")
        except ConfigError as err:
            raise ConfigError(f"--app {spec}: {cls.__name__} cannot name cells: {err}") from err
        if not cls.exposed_methods():
            raise ConfigError(f"--app {spec}: cell class {cls.__name__} has no public method")
    return classes

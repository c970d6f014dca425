"""What the library adapters (kernels/adapters/) offer, read without importing them or their
libraries: `attnreplay kernels` lists them, and `run` registers them, at the cost of reading a few
files; an adapter is imported only when one of its kernels is asked to run (on a thread of its own,
kernels/python/python_kernels.cpp).

An adapter is read as Python source (ast): each class with a literal `name` is a kernel it offers,
its literal class attributes its capabilities; each `ar.optional_import("module", kernels=[...])` is
a library those kernels need. A library is installed when its module's files are on the path: found
the way the import system finds them, without running any of them (importing flash_attn, say, would
load torch and CUDA libraries). Imports nothing beyond the standard library and the plug-in API
(which imports no more).
"""

from __future__ import annotations

import ast
import importlib.machinery
import os
from typing import Optional

import attnreplay_plugin

# The capabilities read, each as ar.Kernel gives it to a kernel that does not say.
DEFAULTS = {key: getattr(attnreplay_plugin.Kernel, key)
            for key in ("summary", "device", "layout", "headline", "reduced_precision", "extensions")}


def module_present(dotted: str) -> bool:
    """Whether `dotted` (a.b.c) would be found by import: its top-level package on sys.path, each
    further part a module or package file inside the one before. Nothing is imported."""
    parts = dotted.split(".")
    spec = importlib.machinery.PathFinder.find_spec(parts[0])
    if spec is None:
        return False
    locations = list(spec.submodule_search_locations or [])
    for i, part in enumerate(parts[1:], start=1):
        found = None
        for folder in locations:
            spec = importlib.machinery.FileFinder(folder, *_loaders()).find_spec(part)
            if spec is not None:
                found = spec
                break
        if found is None:
            return False
        locations = list(found.submodule_search_locations or [])
        if i < len(parts) - 1 and not locations:
            return False  # a module where a package was needed
    return True


def _loaders():
    return [(importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES),
            (importlib.machinery.SourceFileLoader, importlib.machinery.SOURCE_SUFFIXES),
            (importlib.machinery.SourcelessFileLoader, importlib.machinery.BYTECODE_SUFFIXES)]


def _literal(node) -> object:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return None


def _names_of(node, constants: dict) -> list:
    """A kernels= argument: a literal list of names, or a module-level name bound to one."""
    if isinstance(node, ast.Name):
        return list(constants.get(node.id) or [])
    value = _literal(node)
    return list(value) if isinstance(value, (list, tuple)) else []


def describe_adapter(path: str) -> list:
    """One dict per kernel the adapter at `path` offers: name, summary, device, layout, headline,
    reduced_precision, extensions, file, modules (the libraries it needs), missing (those not installed) and
    precompiles (its class compiles ahead: precompile())."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    constants = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            constants[node.targets[0].id] = _literal(node.value)
    needs = {}  # kernel name -> modules
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "optional_import"
                and node.args and isinstance(_literal(node.args[0]), str)):
            for keyword in node.keywords:
                if keyword.arg == "kernels":
                    for name in _names_of(keyword.value, constants):
                        needs.setdefault(name, []).append(_literal(node.args[0]))
    own = {}  # class name -> (its literal attributes, its methods, the names of its bases)
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        attributes, methods = {}, set()
        for statement in node.body:
            if (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                    and isinstance(statement.targets[0], ast.Name)):
                attributes[statement.targets[0].id] = _literal(statement.value)
            elif isinstance(statement, ast.FunctionDef):
                methods.add(statement.name)
        own[node.name] = (attributes, methods, [b.id for b in node.bases if isinstance(b, ast.Name)])

    def inherited(class_name, seen=()):
        """A class's attributes and methods with those of its bases in this file under them, as
        Python resolves them (a kernel class that extends another, flash-attn-4-varlen's)."""
        attributes, methods, bases = own[class_name]
        merged_attributes, merged_methods = {}, set()
        for base in reversed(bases):
            if base in own and base not in seen:
                base_attributes, base_methods = inherited(base, seen + (class_name,))
                merged_attributes.update(base_attributes)
                merged_methods |= base_methods
        merged_attributes.update(attributes)
        return merged_attributes, merged_methods | methods

    kernels = []
    for class_name in own:
        attributes, methods = inherited(class_name)
        name = own[class_name][0].get("name")
        if not isinstance(name, str) or not name:
            continue
        described = {key: attributes.get(key, default) for key, default in DEFAULTS.items()}
        extensions = described["extensions"]
        if not isinstance(extensions, (tuple, list)) or not all(isinstance(e, str) for e in extensions):
            raise ValueError(f"kernel '{name}': extensions must be a literal tuple of names (attnreplay reads "
                             f"adapters without running them), got {extensions!r}")
        described["extensions"] = tuple(extensions)
        modules = needs.get(name, [])
        described.update(name=name, file=path, modules=modules, precompiles="precompile" in methods,
                         missing=[m for m in modules if not module_present(m)])
        kernels.append(described)
    return kernels


def describe_adapters(folder: str) -> tuple:
    """(kernels, problems) of every adapter in `folder`: the kernels as describe_adapter gives them,
    and (file, reason) for a file that cannot be read."""
    if not os.path.isdir(folder):
        return [], [(folder, "the adapters' folder is missing from this installation")]
    kernels, problems = [], []
    for file in sorted(os.listdir(folder)):
        if file.endswith(".py") and not file.startswith("_"):
            path = os.path.join(folder, file)
            try:
                kernels.extend(describe_adapter(path))
            except (OSError, SyntaxError, ValueError) as error:
                problems.append((path, f"{type(error).__name__}: {error}"))
    return kernels, problems


def unavailable_reason(kernel: dict) -> Optional[str]:
    """Why a kernel of describe_adapter() cannot run here: the first library it needs that is not
    installed (the others it names are most often parts of it); None when it can."""
    if not kernel["missing"]:
        return None
    return f"{kernel['missing'][0]} is not installed"

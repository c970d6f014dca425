"""Plug-in kernels (docs/plugins.md): Python modules and C++ libraries loaded into attnreplay, run,
timed and judged like the built-in kernels; their failures isolated; their flags in every rerun."""

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import FAST, SOURCE_DIR, binary, load_json, run_attnreplay

PLUGINS = Path(__file__).resolve().parent / "plugins"
TORCH_PLUGINS = PLUGINS / "torch_plugins.py"
BROKEN_PLUGINS = PLUGINS / "broken_plugins.py"
NOT_IMPORTING = PLUGINS / "does_not_import.py"
GENERATED = ["--shape", "2,4,48,32", "--dtype", "fp32"]


def kernels_by_name(report, call=0):
    return {k["kernel"]: k for k in report["calls"][call]["kernels"]}


def rerun(command, **kwargs):
    argv = shlex.split(command)
    assert argv[0] == "attnreplay"
    return subprocess.run([binary(), *argv[1:]], capture_output=True, text=True, timeout=300, **kwargs)


def test_python_kernel_is_timed_and_judged_beside_the_built_ins(tmp_path):
    out = tmp_path / "r.json"
    run_attnreplay("run", *GENERATED, "--causal", "--num_kv_heads", "2", "--kernel-module", TORCH_PLUGINS,
                   "--kernels", "reference,torch-math,py-sdpa", "--json", out, *FAST, check=0)
    row = kernels_by_name(load_json(out))["py-sdpa"]
    assert row["status"] == "not_verified", row
    assert row["kernel_source"] == str(TORCH_PLUGINS)
    assert row["timing"]["samples"] >= 2 and row["timing"]["median_s"] > 0
    assert row["timing"]["method"] == "cpu-steady-clock"
    assert row["error"]["rel_l2"] < 1e-6 and row["error"]["nan_count"] == 0
    assert "--kernel-module " + str(TORCH_PLUGINS) in row["rerun"]


def test_preparation_is_timed_alone_and_with_the_kernel(tmp_path):
    out = tmp_path / "r.json"
    run_attnreplay("run", *GENERATED, "--kernel-module", TORCH_PLUGINS, "--kernels", "py-fp64-prepared",
                   "--json", out, *FAST, check=0)
    row = kernels_by_name(load_json(out))["py-fp64-prepared"]
    assert row["status"] == "not_verified", row
    assert row["timing"]["median_s"] > 0 and row["timing_with_preparation"]["median_s"] > 0
    assert row["error"]["rel_l2"] < 1e-6


def test_each_row_says_what_its_headline_covers(tmp_path):
    # The kernel alone with the whole call beside it (the default), a library's whole call with the
    # kernel alone beside it ("call"), a library's call with its set-up beside it ("run").
    out = tmp_path / "r.json"
    result = run_attnreplay("run", *GENERATED, "--kernel-module", TORCH_PLUGINS, "--kernels",
                            "py-fp64-prepared,py-fp64-call,py-fp64-run", "--json", out, *FAST, check=0)
    rows = kernels_by_name(load_json(out))
    kernel, call, run = rows["py-fp64-prepared"], rows["py-fp64-call"], rows["py-fp64-run"]
    assert kernel["timed"] == "kernel" and "timing_with_preparation" in kernel and "timing_kernel_alone" not in kernel
    assert call["timed"] == "call" and "timing_kernel_alone" in call and "timing_with_preparation" not in call
    # The 5 ms sleep is inside the whole call, not the kernel alone (half of it: the two medians are
    # timed apart, and a loaded machine moves each).
    assert call["timing"]["median_s"] - call["timing_kernel_alone"]["median_s"] > 0.0025
    assert run["timed"] == "call" and "timing_with_preparation" in run and "timing_kernel_alone" not in run
    table = {line.split()[0]: line.split()[2] for line in result.stdout.splitlines()  # the call's table rows
             if line.split()[:1] and line.split()[0].startswith("py-fp64-") and line.split()[1] == "not_verified"}
    assert table == {"py-fp64-prepared": "kernel", "py-fp64-call": "call", "py-fp64-run": "call"}
    assert "py-fp64-call: " in result.stdout and "ms the kernel alone" in result.stdout


def test_a_headline_other_than_kernel_call_or_run_is_refused_naming_the_file(tmp_path):
    module = PLUGINS / "bad_headline.py"
    result = run_attnreplay("run", *GENERATED, "--kernel-module", module, "--kernels", "torch-math", *FAST, check=1)
    assert str(module) in result.stderr and "headline 'both'" in result.stderr
    assert "Traceback" not in result.stderr


def test_capabilities_and_supports_decline_with_the_reason(tmp_path):
    out = tmp_path / "r.json"
    run_attnreplay("run", "--shape", "1,2,16,32", "--s_kv", "5000", "--dtype", "fp32", "--kernel-module",
                   TORCH_PLUGINS, "--kernels", "py-fp64-prepared,py-sdpa", "--json", out, *FAST, check=0)
    rows = kernels_by_name(load_json(out))
    assert rows["py-fp64-prepared"]["status"] == "not_supported"
    assert rows["py-fp64-prepared"]["reason"] == "declines calls longer than 4096 keys"
    out2 = tmp_path / "r2.json"
    run_attnreplay("run", *GENERATED, "--causal", "--s_kv", "64", "--causal_alignment", "bottom_right",
                   "--kernel-module", TORCH_PLUGINS, "--kernels", "py-sdpa,py-fp64-prepared", "--json", out2,
                   *FAST, check=0)
    rows = kernels_by_name(load_json(out2))
    assert rows["py-sdpa"]["status"] == "not_supported"
    assert "bottom_right" in rows["py-sdpa"]["reason"] and "top_left" in rows["py-sdpa"]["reason"]
    assert rows["py-fp64-prepared"]["reason"] == "causal attention is not supported"


def test_a_kernel_may_decline_once_it_sees_the_tensors(tmp_path):
    out = tmp_path / "r.json"
    run_attnreplay("run", *GENERATED, "--kernel-module", TORCH_PLUGINS, "--kernels", "py-declines-late,py-sdpa",
                   "--json", out, *FAST, check=0)
    rows = kernels_by_name(load_json(out))
    assert rows["py-declines-late"]["status"] == "not_supported"
    assert rows["py-declines-late"]["reason"] == "no implementation for these strides"
    assert rows["py-sdpa"]["status"] == "not_verified"


def test_rerun_command_reproduces_a_plug_in_row_of_a_capture(tmp_path):
    capture = tmp_path / "cap.h5"
    run_attnreplay("run", *GENERATED, "--kernels", "reference", "--save-inputs", capture, *FAST, "-q", check=0)
    out = tmp_path / "r.json"
    run_attnreplay("run", capture, "--kernel-module", TORCH_PLUGINS, "--kernels", "py-sdpa", "--json", out,
                   *FAST, check=0)
    first = kernels_by_name(load_json(out))["py-sdpa"]
    again = tmp_path / "again.json"
    result = rerun(first["rerun"] + f" --json {again}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    second = kernels_by_name(load_json(again))["py-sdpa"]
    assert second["status"] == "not_verified"
    assert second["error"]["max_abs"] == first["error"]["max_abs"]


def test_broken_kernels_fail_alone_and_leave_the_inputs_unchanged(tmp_path):
    out = tmp_path / "r.json"
    result = run_attnreplay("run", *GENERATED, "--kernel-module", BROKEN_PLUGINS, "--kernel-module", TORCH_PLUGINS,
                            "--kernels", "all,reference", "--json", out, *FAST)
    assert result.returncode == 1, result.stderr
    rows = kernels_by_name(load_json(out))
    expected = {
        "py-raises": "run(): ValueError: deliberately broken kernel",
        "py-wrong-shape": "run() returned shape (2, 4, 1, 32), expected (2, 4, 48, 32)",
        "py-wrong-dtype": "run() returned dtype float64, expected float32",
        "py-not-a-tensor": "run() returned list, expected a torch.Tensor",
        "py-writes-input": "the kernel wrote into its input 'k'",
        "py-supports-raises": "supports(): KeyError: 'no such field'",
    }
    for name, reason in expected.items():
        assert rows[name]["status"] == "failed", rows[name]
        assert rows[name]["reason"].startswith(reason), rows[name]["reason"]
        assert "timing" not in rows[name] and "error" not in rows[name]
    # The traceback goes to the JSON, not the table.
    assert "Traceback" in rows["py-raises"]["detail"] and "broken_plugins.py" in rows["py-raises"]["detail"]
    assert "Traceback" not in result.stdout
    # Kernels after the one that wrote into its inputs see the call's own values.
    for name in ("py-sdpa", "torch-math", "reference"):
        assert rows[name]["status"] == "not_verified", rows[name]
    assert rows["py-sdpa"]["error"]["rel_l2"] < 1e-6
    assert rows["torch-math"]["error"]["rel_l2"] < 1e-6


def test_a_module_that_does_not_import_is_an_error_naming_it(tmp_path):
    out = tmp_path / "r.json"
    result = run_attnreplay("run", *GENERATED, "--kernel-module", NOT_IMPORTING, "--kernel-module", TORCH_PLUGINS,
                            "--kernels", "all", "--json", out, *FAST)
    assert result.returncode == 1
    message = f"{NOT_IMPORTING}: does not load: ModuleNotFoundError: No module named 'a_package_that_is_not_installed'"
    assert "error: " + message in result.stderr
    report = load_json(out)
    assert report["input_errors"] == [message]
    rows = kernels_by_name(report)
    assert rows["py-sdpa"]["status"] == "not_verified" and rows["torch-math"]["status"] == "not_verified"
    assert "Traceback" not in result.stderr


def test_modules_from_the_environment_and_by_module_name(tmp_path):
    out = tmp_path / "r.json"
    env = {**os.environ, "ATTNREPLAY_KERNEL_MODULES": str(TORCH_PLUGINS)}
    subprocess.run([binary(), "run", *GENERATED, "--kernels", "py-sdpa", "--json", out, *FAST], env=env, check=True,
                   capture_output=True)
    row = kernels_by_name(load_json(out))["py-sdpa"]
    assert row["status"] == "not_verified" and "--kernel-module" in row["rerun"]
    # An importable module name, found on PYTHONPATH.
    env = {**os.environ, "PYTHONPATH": str(PLUGINS)}
    result = subprocess.run([binary(), "kernels", "--kernel-module", "torch_plugins"], env=env, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    assert f"from {TORCH_PLUGINS}" in result.stdout


def test_kernels_lists_plug_ins_with_their_files_and_missing_adapters():
    result = run_attnreplay("kernels", "--kernel-module", TORCH_PLUGINS, "--kernel-library",
                            os.environ["ATTNREPLAY_PLUGIN_KERNEL_LIB"], check=0)
    lines = result.stdout.splitlines()
    assert any(line.startswith("py-sdpa ") for line in lines)
    assert f"from {TORCH_PLUGINS}" in result.stdout
    assert f"from {os.environ['ATTNREPLAY_PLUGIN_KERNEL_LIB']}" in result.stdout
    # CI installs none of the libraries the adapters wrap: each says which is missing, found without
    # importing anything.
    assert "unavailable here:" in result.stdout
    unavailable = result.stdout.split("unavailable here:")[1]
    assert re.search(r"^flash-attn-4 +flash_attn.cute.interface is not installed$", unavailable, re.M), unavailable
    # One column of names, as wide as the longest: every reason starts at the same place.
    rows = [line for line in unavailable.splitlines() if line.strip()]
    starts = {len(line) - len(line.split(None, 1)[1]) for line in rows}
    assert len(starts) == 1 and max(len(line.split()[0]) for line in rows) < starts.pop(), rows


def test_kernels_lists_the_adapters_importing_no_library():
    """`attnreplay kernels` reads the adapters without importing them: not torch, not a library
    (Python's own record of its imports says so), which is what keeps it under a second."""
    env = dict(os.environ, PYTHONPROFILEIMPORTTIME="1")
    result = run_attnreplay("kernels", env=env, check=0)
    imported = [line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")]
    assert "ast" in imported, "Python ran, and its imports were recorded"
    assert not [name for name in imported if name.split(".")[0] in ("torch", "flash_attn", "numpy")], imported
    assert any(line.startswith("flex-attention ") for line in result.stdout.splitlines())


def test_cpp_plug_in_library(tmp_path):
    library = os.environ["ATTNREPLAY_PLUGIN_KERNEL_LIB"]
    out = tmp_path / "r.json"
    run_attnreplay("run", *GENERATED, "--num_kv_heads", "2", "--s_kv", "70", "--causal", "--causal_alignment",
                   "bottom_right", "--kernel-library", library, "--kernels", "reference,cpp-plugin-naive",
                   "--json", out, *FAST, check=0)
    row = kernels_by_name(load_json(out))["cpp-plugin-naive"]
    assert row["status"] == "not_verified", row
    assert row["kernel_source"] == library
    assert row["error"]["rel_l2"] < 1e-6
    assert "--kernel-library " + library in row["rerun"]


def test_plug_ins_get_the_ordinary_exit_where_they_write_what_they_hold(tmp_path):
    # attnreplay ends without libtorch's teardown only where no plug-in code ran: a C++ library's
    # static destructors and a Python module's exit handlers still run, after the record is written.
    mark = tmp_path / "cpp.mark"
    out = tmp_path / "cpp.json"
    run_attnreplay("run", *GENERATED, "--kernel-library", os.environ["ATTNREPLAY_PLUGIN_KERNEL_LIB"], "--kernels",
                   "cpp-plugin-naive", "--json", out, *FAST, check=0,
                   env={**os.environ, "ATTNREPLAY_TEST_EXIT_MARK": str(mark)})
    assert load_json(out)["calls"][0]["kernels"][0]["status"] == "not_verified"
    assert mark.read_text() == "destructors ran\n"

    module = tmp_path / "exit_handler.py"
    mark = tmp_path / "py.mark"
    module.write_text(f"import atexit\nfrom torch_plugins import sdpa\n"
                      f"atexit.register(lambda: open({str(mark)!r}, 'w').write('exit handlers ran'))\n")
    out = tmp_path / "py.json"
    run_attnreplay("run", *GENERATED, "--kernel-module", module, "--kernels", "py-sdpa", "--json", out, *FAST, check=0,
                   env={**os.environ, "PYTHONPATH": f"{PLUGINS}:{os.environ.get('PYTHONPATH', '')}"})
    assert load_json(out)["calls"][0]["kernels"][0]["status"] == "not_verified"
    assert mark.read_text() == "exit handlers ran"


def test_a_libtorch_error_is_its_message_with_the_backtrace_in_the_json(tmp_path):
    out = tmp_path / "r.json"
    result = run_attnreplay("run", *GENERATED, "--kernel-library", os.environ["ATTNREPLAY_PLUGIN_TORCH_CHECK_LIB"],
                            "--kernels", "cpp-plugin-torch-check,torch-math", "--json", out, *FAST)
    assert result.returncode == 1
    rows = kernels_by_name(load_json(out))
    row = rows["cpp-plugin-torch-check"]
    assert row["status"] == "failed"
    assert row["reason"] == "attn_bias: wrong shape (head dimension)"
    assert "Exception raised from" in row["detail"]
    assert "Exception raised from" not in result.stdout
    assert rows["torch-math"]["status"] == "not_verified"


def test_cpp_library_taking_a_built_in_name_is_refused(tmp_path):
    duplicate = os.environ["ATTNREPLAY_PLUGIN_DUPLICATE_LIB"]
    out = tmp_path / "r.json"
    result = run_attnreplay("run", *GENERATED, "--kernel-library", duplicate, "--kernel-library", "no/such/lib.so",
                            "--kernels", "reference,torch-math", "--json", out, *FAST)
    assert result.returncode == 1
    report = load_json(out)
    assert f"{duplicate}: kernel 'reference' is already registered by built-in" in report["input_errors"]
    assert "no/such/lib.so: no such kernel library" in report["input_errors"]
    assert kernels_by_name(report)["reference"]["reason"] == ""


def test_audit_takes_plug_ins(tmp_path):
    capture = tmp_path / "cap.h5"
    run_attnreplay("run", *GENERATED, "--kernels", "reference", "--save-inputs", capture, *FAST, "-q", check=0)
    out = tmp_path / "audit.json"
    run_attnreplay("audit", capture, "--kernel-module", TORCH_PLUGINS, "--kernels", "py-sdpa", "--json", out,
                   "-q", check=0)
    report = load_json(out)
    assert "py-sdpa" in {k["kernel"] for k in report["kernels"]}


@pytest.mark.skipif(not shutil.which("nvcc") and not Path("/usr/local/cuda/bin/nvcc").exists(), reason="no nvcc")
def test_installed_tree_builds_and_loads_the_cuda_example(tmp_path):
    """cmake --install, moved elsewhere: its attnreplay finds the plug-in API, and the CUDA example
    builds against its CMake package (it runs on a GPU only: here it declines)."""
    build_dir = Path(os.environ["ATTNREPLAY_BUILD_DIR"])
    subprocess.run(["cmake", "--install", build_dir, "--prefix", tmp_path / "installed"], check=True,
                   capture_output=True)
    moved = tmp_path / "moved"
    shutil.move(tmp_path / "installed", moved)
    example_build = tmp_path / "example"
    env = {**os.environ, "PATH": os.environ["PATH"] + ":/usr/local/cuda/bin"}
    subprocess.run(["cmake", "-S", SOURCE_DIR / "examples/plugins/cuda_kernel", "-B", example_build,
                    f"-DCMAKE_PREFIX_PATH={moved}", "-DCMAKE_CUDA_ARCHITECTURES=90"], check=True, capture_output=True,
                   env=env)
    subprocess.run(["cmake", "--build", example_build], check=True, capture_output=True, env=env)
    library = example_build / "libcuda_tiled_attention.so"
    out = tmp_path / "r.json"
    result = subprocess.run([moved / "bin/attnreplay", "run", *GENERATED, "--kernel-library", library,
                             "--kernel-module", TORCH_PLUGINS, "--kernels", "cuda-tiled,py-sdpa", "--json", out,
                             *FAST], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = kernels_by_name(load_json(out))
    assert rows["cuda-tiled"]["status"] == "not_supported" and "no CUDA device" in rows["cuda-tiled"]["reason"]
    assert rows["py-sdpa"]["status"] == "not_verified"
    # The installed tree's own copy of the API, not the source tree's.
    listing = subprocess.run([moved / "bin/attnreplay", "kernels"], capture_output=True, text=True).stdout
    assert str(SOURCE_DIR) not in listing


STAND_INS = Path(__file__).resolve().parent / "stand_ins"
ADAPTER_KERNELS = ["flash-attn-2", "flash-attn-3", "flash-attn-4", "xformers", "flex-attention", "transformer-engine",
                   "sageattn-triton"]


def test_library_adapters_run_through_attnreplay_against_stand_ins(tmp_path):
    """The adapters' whole path in attnreplay (call description, layout, GQA, causal alignment,
    output checks, timing, error statistics) on the CPU, the libraries replaced by stand-ins that
    follow each library's own conventions; the real ones need a GPU."""
    env = {**os.environ, "PYTHONPATH": str(STAND_INS)}
    listing = subprocess.run([binary(), "kernels"], env=env, capture_output=True, text=True).stdout
    for name in ADAPTER_KERNELS + ["flash-attn-3-fp8", "flashinfer-prefill", "sage2-cuda"]:
        assert any(line.startswith(name + " ") for line in listing.splitlines()), name
    out = tmp_path / "r.json"
    command = [binary(), "run", "--shape", "1,4,40,64", "--s_kv", "72", "--num_kv_heads", "2", "--dtype", "bf16",
               "--causal", "--causal_alignment", "bottom_right", "--kernel-module", PLUGINS / "adapters_on_cpu.py",
               "--kernels", "all", "--json", out, *FAST]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = kernels_by_name(load_json(out))
    assert rows["flash-attn-2"]["status"] == "not_supported" and rows["flash-attn-2"]["reason"] == "no CUDA device"
    for name in ["flash-attn-2", "flash-attn-3", "xformers", "flex-attention", "transformer-engine"]:
        row = rows[name + "-on-cpu"]
        assert row["status"] == "not_verified", (name, row["reason"])
        assert row["error"]["rel_l2"] < 1e-2, (name, row["error"])
    # SageAttention's Triton kernel computes top-left only: a bottom-right call is declined, by name.
    assert rows["sageattn-triton-on-cpu"]["status"] == "not_supported"
    assert "bottom_right" in rows["sageattn-triton-on-cpu"]["reason"]


def extension_call(path, dtype, *, window_left=None, window_right=None, softcap=0.0, alibi=None, sinks=None,
                   heads=4, seq_q=40, seq_kv=72, dim=64, causal=True):
    """One .pt call (docs/format.md), bottom-right as flash-attn's ops record it, with the extensions given."""
    import torch

    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, heads, seq_q, dim, generator=g).to(dtype)
    k, v = (torch.randn(1, heads, seq_kv, dim, generator=g).to(dtype) for _ in range(2))
    torch.save({"format": "attnreplay.call", "schema_version": 2, "call_index": 0, "op": "test::extensions",
                "backend": "", "layout": "bhsd", "is_causal": causal, "causal_alignment": "bottom_right",
                "scale": 0.3, "dropout_p": 0.0, "enable_gqa": False, "window_left": window_left,
                "window_right": window_right, "softcap": softcap, "q": q, "k": k, "v": v, "mask": None, "out": None,
                "alibi_slopes": alibi, "sinks": sinks, "metadata": {}}, path)
    return path


def test_a_python_kernel_computes_the_extensions_it_declares_and_is_refused_the_others(tmp_path):
    import torch

    call = extension_call(tmp_path / "call.pt", torch.float64, window_left=3, window_right=1, softcap=2.5,
                          alibi=torch.tensor([0.5, 0.25, 0.125, 0.0625]), sinks=torch.tensor([0.5, -1.0, 2.0, 0.0]),
                          seq_q=5, seq_kv=9, dim=8)
    out = tmp_path / "r.json"
    run_attnreplay("run", call, "--kernel-module", PLUGINS / "extension_plugins.py", "--kernels",
                   "reference,py-extensions,py-no-extensions", "--json", out, *FAST, check=0)
    rows = kernels_by_name(load_json(out))
    assert rows["py-extensions"]["status"] == "not_verified", rows["py-extensions"]
    assert rows["py-extensions"]["error"]["max_abs"] < 1e-12
    assert rows["py-no-extensions"]["status"] == "not_supported"
    assert rows["py-no-extensions"]["reason"] == (
        "the call has a sliding window (left 3, right 1) and a softcap of 2.5 and ALiBi slopes and attention sinks, "
        "which this kernel does not compute")


def test_an_unknown_extension_is_refused_naming_the_file_and_kernel(tmp_path):
    module = PLUGINS / "bad_extension.py"
    result = run_attnreplay("run", *GENERATED, "--kernel-module", module, "--kernels", "torch-math", *FAST, check=1)
    assert str(module) in result.stderr and "kernel 'py-misspelled-extension'" in result.stderr
    assert "('windows',)" in result.stderr and "Traceback" not in result.stderr


def test_library_adapters_honour_windows_softcaps_alibi_and_sinks_through_attnreplay(tmp_path):
    """The extensions' whole path to an adapter (the call's fields in its CallSpec, the slopes and
    sinks in its Inputs, the library's arguments) against the stand-ins, on the CPU."""
    import torch

    env = {**os.environ, "PYTHONPATH": str(STAND_INS)}
    kernels = ["reference", *(name + "-on-cpu" for name in ("flash-attn-2", "flash-attn-3", "flash-attn-4",
                                                            "flashinfer-prefill", "xformers"))]
    rows = {}
    for name, extensions in (("alibi", dict(window_left=12, softcap=2.0, alibi=torch.linspace(0.05, 0.2, 4))),
                             ("sinks", dict(window_left=12, softcap=2.0, sinks=torch.tensor([0.5, 2.0, -1.0, 3.0])))):
        call = extension_call(tmp_path / f"{name}.pt", torch.bfloat16, **extensions)
        out = tmp_path / f"{name}.json"
        run_attnreplay("run", call, "--kernel-module", PLUGINS / "adapters_on_cpu.py", "--kernels", ",".join(kernels),
                       "--json", out, *FAST, check=0, env=env)
        rows[name] = kernels_by_name(load_json(out))
    honoured = {"alibi": ["flash-attn-2"], "sinks": ["flash-attn-4"]}
    refused = {"alibi": {"flash-attn-3": "ALiBi slopes", "flash-attn-4": "ALiBi slopes",
                         "flashinfer-prefill": "ALiBi slopes", "xformers": "a sliding window (left 12)"},
               "sinks": {"flash-attn-2": "attention sinks", "flash-attn-3": "attention sinks",
                         "flashinfer-prefill": "attention sinks", "xformers": "a sliding window (left 12)"}}
    for case in rows:
        for name in honoured[case]:
            row = rows[case][name + "-on-cpu"]
            assert row["status"] == "not_verified", (case, name, row.get("reason"))
            assert row["error"]["rel_l2"] < 1e-2, (case, name, row["error"])
        for name, what in refused[case].items():
            row = rows[case][name + "-on-cpu"]
            assert row["status"] == "not_supported" and what in row["reason"], (case, name, row.get("reason"))

# EXPERIMENT (temporary): outputs with and without an environment variable, bit for bit.
import os, subprocess, sys, tempfile, torch
binary, var = sys.argv[1], sys.argv[2]
shapes = [["--shape", "1,25,300,128", "--s_kv", "4096"], ["--shape", "1,24,4608,128"], ["--shape", "4,32,4096,128"],
          ["--shape", "1,25,300,128", "--s_kv", "4096", "--quant_gran", "per_thread"]]
bad = 0
for shape in shapes:
    outs = []
    for env in ({}, {var: "1"}):
        d = tempfile.mkdtemp()
        subprocess.run([binary, "run", *shape, "--kernels", "sage1-int8", "--save-outputs", d, "-q", "--min-samples", "3",
                        "--min-time", "0", "--timeout", "1", "--no-ceilings", "--ref-sample-rows", "8"],
                       env=dict(os.environ, **env), check=True, capture_output=True)
        outs.append(torch.load(os.path.join(d, "call0_sage1-int8.pt"), weights_only=True)["out"])
    same = torch.equal(outs[0], outs[1])
    bad += not same
    print(" ".join(shape), "same" if same else "DIFFER")
sys.exit(bad)

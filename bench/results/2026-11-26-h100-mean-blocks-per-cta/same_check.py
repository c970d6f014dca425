# EXPERIMENT (temporary): outputs with and without an environment variable, bit for bit.
import os, subprocess, sys, tempfile, torch
binary, var, value = sys.argv[1], sys.argv[2], sys.argv[3]
shapes = [["--shape", "1,3,300,64", "--s_kv", "4250"], ["--shape", "1,2,100,64", "--s_kv", "17776"],
          ["--shape", "1,8,100,128", "--s_kv", "8192"], ["--shape", "1,2,64,128", "--s_kv", "50688"],
          ["--shape", "1,2,64,64", "--s_kv", "131072"], ["--shape", "2,4,100,64", "--s_kv", "1000", "--num_kv_heads", "2"]]
bad = 0
for shape in shapes:
    for kernel in ("sage1-int8", "sage2-int8-fp8"):
        outs = []
        for env in ({}, {var: value}):
            d = tempfile.mkdtemp()
            subprocess.run([binary, "run", *shape, "--kernels", kernel, "--save-outputs", d, "-q", "--min-samples", "3",
                            "--min-time", "0", "--timeout", "1", "--no-ceilings", "--ref-sample-rows", "8"],
                           env=dict(os.environ, **env), check=True, capture_output=True)
            outs.append(torch.load(os.path.join(d, f"call0_{kernel}.pt"), weights_only=True)["out"])
        same = torch.equal(outs[0], outs[1])
        bad += not same
        print(var, value, kernel, " ".join(shape), "same" if same else "DIFFER")
sys.exit(bad)

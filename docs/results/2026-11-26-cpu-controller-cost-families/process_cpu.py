"""CPU of one engine process (user + system, getrusage of the child), five times: CHECKOUT COMMAND...

Usage: .venv/bin/python process_cpu.py CHECKOUT check --help  (CHECKOUT/src first on PYTHONPATH)
"""

import os, resource, subprocess, sys
w, *cmd = sys.argv[1:]
best = []
for _ in range(5):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "gpufleet", *cmd], env=dict(os.environ, PYTHONPATH=w + "/src"), capture_output=True)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    best.append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
print(f"{w} {' '.join(cmd)}: min {min(best)*1e3:.0f} ms median {sorted(best)[2]*1e3:.0f} ms CPU")

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""check_pip_install.py SOURCE_DIR VERSION WORK: `pip install ./python` works and installs an
importable expseg whose version is the library's. Offline: the copy of python/ is built with
the setuptools already installed (--no-build-isolation) into WORK/site (--target), so
nothing is fetched and nothing is written into the source tree. Skipped (exit 77, saying
why) when pip or setuptools is missing."""
import importlib.util, os, shutil, subprocess, sys

src, version, work = sys.argv[1], sys.argv[2], sys.argv[3]
# the first Python with what an offline build needs: this one, else the system's
NEEDS = "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in ('pip', 'setuptools', 'wheel')))"
py = None
for cand in (sys.executable, "/usr/bin/python3"):
    if os.path.exists(cand) and subprocess.run([cand, "-c", NEEDS]).returncode == 0:
        py = cand
        break
if py is None:
    print("SKIP: pip install ./python offline needs pip, setuptools and wheel in %s or "
          "/usr/bin/python3 (apt-get install python3-pip python3-wheel)" % sys.executable)
    sys.exit(77)
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
copy = os.path.join(work, "python")
shutil.copytree(os.path.join(src, "python"), copy, ignore=shutil.ignore_patterns("__pycache__"))
site = os.path.join(work, "site")
p = subprocess.run([py, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                    "--no-index", "--target", site, copy], capture_output=True, text=True)
print(p.stdout[-3000:], p.stderr[-3000:])
if p.returncode != 0:
    sys.exit("pip install ./python failed (exit %d)" % p.returncode)
for m in ("expseg.py", "expseg_pytorch.py", "expseg_interop.py", "_expseg_cxx.py"):
    if not os.path.isfile(os.path.join(site, m)):
        sys.exit("pip install ./python did not install %s" % m)
meta = [d for d in os.listdir(site) if d.startswith("expseg-") and d.endswith(".dist-info")]
if meta != ["expseg-%s.dist-info" % version]:
    sys.exit("installed metadata %s; expected expseg-%s.dist-info (the library's version)"
             % (meta, version))
env = dict(os.environ, PYTHONPATH=site, PYTHONDONTWRITEBYTECODE="1")
q = subprocess.run([py, "-c", "import expseg; print(expseg.__file__)"], cwd=work,
                   env=env, capture_output=True, text=True)
if q.returncode != 0 or not q.stdout.strip().startswith(site):
    sys.exit("the installed expseg does not import from %s: %s %s" % (site, q.stdout, q.stderr))
print("pip install ./python: expseg %s importable from %s" % (version, site))

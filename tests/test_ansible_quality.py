"""ansible-lint (production profile) on the repository and ansible-test
sanity on the collection's plugins and roles."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import tool_modules

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PY = f"{sys.version_info.major}.{sys.version_info.minor}"

SANITY_IGNORES = tool_modules.load("sanity_ignores")

# ansible-test bootstraps pip into its sanity venvs with a get-pip.py that it
# downloads from a host outside the package registries. This stand-in does the
# same from ensurepip's bundled wheel and the configured package index.
GET_PIP_STANDIN = '''\
"""Stand-in for get-pip.py: pip from ensurepip's bundled wheel, then the requested versions from the index."""
import ensurepip
import os
import subprocess
import sys

env = dict(os.environ)  # ensurepip points PIP_CONFIG_FILE at /dev/null; keep the index settings for the install
ensurepip.bootstrap(upgrade=True)
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install"] + args, env=env))
'''


def tool_env(**extra: str) -> dict:
    return dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", ANSIBLE_NOCOLOR="1", NO_COLOR="1", **extra)


def test_ansible_lint_production_profile_is_clean():
    proc = subprocess.run(
        [str(BIN / "ansible-lint"), "--profile", "production", "--offline", "--nocolor"],
        cwd=REPO,
        env=tool_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "0 failure(s), 0 warning(s)" in out, out
    assert "Profile 'production' was required, and it passed" in out, out


def _ansible_test_pip_version() -> str:
    import ansible_test

    source = (Path(ansible_test.__file__).parent / "_internal" / "python_requirements.py").read_text()
    match = re.search(r"pip='([0-9.]+)'", source)
    assert match, "cannot find the pip version ansible-test bootstraps"
    return match.group(1)


@pytest.fixture(scope="session")
def ansible_test_home() -> Path:
    """A HOME for ansible-test kept under the repository's .ansible/ (git-ignored), so its sanity venvs are
    built once and reused, and the user's own ~/.ansible is left alone."""
    home = REPO / ".ansible" / "ansible-test-home"
    version = _ansible_test_pip_version()
    cache = home / ".ansible" / "test" / "cache" / f"get_pip_{version.replace('.', '_')}.py"
    cache.parent.mkdir(parents=True, exist_ok=True)
    if not cache.is_file() or cache.read_text() != GET_PIP_STANDIN:
        cache.write_text(GET_PIP_STANDIN)
    return home


def test_ansible_test_sanity(tmp_path, ansible_test_home):
    """Where a user has it: the tarball built and installed, checked with the ignore file it ships."""
    from ansible.release import __version__ as core_version

    env = tool_env(ANSIBLE_COLLECTIONS_PATH=str(tmp_path / "collections"))
    subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "build", str(REPO), "--output-path", str(tmp_path / "dist")],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    (tarball,) = (tmp_path / "dist").glob("gpufleet-cluster-*.tar.gz")
    subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "install", str(tarball), "-p", str(tmp_path / "collections")],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    root = tmp_path / "collections" / "ansible_collections" / "gpufleet" / "cluster"
    assert sorted((root / "plugins" / "modules").glob("*.py"))
    ignore = root / "tests" / "sanity" / f"ignore-{'.'.join(core_version.split('.')[:2])}.txt"
    assert ignore.is_file(), (
        f"the collection ships no {ignore.name} for ansible-core {core_version}: add it to tools/sanity_ignores.py"
    )
    # The installed copy's ignore files are what its own files call for (make generate writes them).
    assert not SANITY_IGNORES.stale(root), "run make generate"

    proc = subprocess.run(
        [str(BIN / "ansible-test"), "sanity", "--python", PY, "--requirements", "--color", "no"],
        cwd=root,
        env=tool_env(HOME=str(ansible_test_home)),
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert 'Running sanity test "validate-modules"' in out, out
    assert 'Running sanity test "pylint"' in out, out

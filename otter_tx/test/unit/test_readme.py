"""
The README's promises a new user acts on first (issue 19): its options
table names every ``twistd ottermq`` option, and its test command (command
2, the same string as ``.ci/run``'s ``TEST_CMD``) goes on to the tests when
``npm`` is there but ``npm ci`` fails (no registry), as when ``npm`` is
absent, so the Node.js tests then skip with their reason instead of no test
running at all.

The npm step is run by ``bash`` with a stand-in ``npm`` on ``PATH`` (a
script that fails or succeeds at once), never the real one, and the rest of
the command is replaced by an ``echo``: no network, no virtualenv.  Skipped
outside a source checkout (an installed wheel has no README).
"""

import os
import re
import shutil
import subprocess
import tempfile

from twisted.trial.unittest import SkipTest, SynchronousTestCase

import otter_tx
from otter_tx.service import tap

#: the source checkout's root (absent from an installed wheel)
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(otter_tx.__file__)), os.pardir))

#: command 2's npm step: run ``npm ci`` when npm exists, and go on (saying so) when it fails
_NPM_STEP = re.compile(r"\{ ! command -v npm >/dev/null \|\| npm ci [^;]*; \}")


def _read(*parts):
    path = os.path.join(ROOT, *parts)
    if not os.path.exists(path):
        raise SkipTest("%s is not here (not a source checkout)" % (os.path.join(*parts),))
    with open(path, encoding="utf-8") as f:
        return f.read()


def testCommand():
    """The README's command 2 (str): the line that makes .venv-test and runs trial."""
    [line] = [ln for ln in _read("README.md").splitlines() if ln.startswith("python3 -m venv .venv-test ")]
    return line


class OptionsTableTests(SynchronousTestCase):
    """README's "Running" table names every option of ``twistd ottermq``."""

    def test_everyOptionListed(self):
        readme = _read("README.md")
        options = tap.Options()
        names = {row[0] for row in getattr(options, "optParameters", []) + getattr(options, "optFlags", [])}
        names.update(n[len("opt_"):].replace("_", "-") for n in dir(options) if n.startswith("opt_"))
        names.discard("help")  # twistd's usage option
        missing = sorted(n for n in names if not re.search(r"`--%s[` ]" % (re.escape(n),), readme))
        self.assertEqual(missing, [], "options missing from README.md's table")


class TestCommandTests(SynchronousTestCase):
    """Command 2's npm step, with a stand-in npm."""

    def setUp(self):
        self.bash = shutil.which("bash")
        if self.bash is None:
            raise SkipTest("bash is not installed")
        self.bin = tempfile.mkdtemp(prefix="otter-npm-")
        self.addCleanup(shutil.rmtree, self.bin, True)

    def fakeNpm(self, status):
        """A stand-in ``npm`` in :attr:`bin` that says what it was asked and exits with ``status``."""
        path = os.path.join(self.bin, "npm")
        with open(path, "w") as f:
            f.write("#!%s\necho \"npm $*\" >&2\n%sexit %d\n" % (
                self.bash, 'echo "npm ERR! network request failed (ECONNREFUSED)" >&2\n' if status else "", status))
        os.chmod(path, 0o755)

    def runStep(self):
        """Command 2's npm step followed by ``&& echo TESTS RUN``: ``(exit status, stdout, stderr)``."""
        match = _NPM_STEP.search(testCommand())
        self.assertIsNotNone(match, "README's command 2 has no npm step of the expected shape")
        result = subprocess.run([self.bash, "-c", match.group(0) + " && echo 'TESTS RUN'"],
                                env={"PATH": self.bin, "HOME": self.bin}, cwd=self.bin,
                                capture_output=True, text=True, timeout=30)
        return result.returncode, result.stdout, result.stderr

    def test_sameAsCI(self):
        """.ci/run runs the README's command 2, character for character."""
        [ci] = re.findall(r'^TEST_CMD="(.*)"$', _read(".ci", "run"), re.M)
        self.assertEqual(ci, testCommand())

    def test_npmCannotReachRegistry(self):
        """npm ci fails: the command says so and goes on to the tests."""
        self.fakeNpm(1)
        status, out, err = self.runStep()
        self.assertEqual((status, out), (0, "npm ci failed: the Node tests will skip\nTESTS RUN\n"), err)
        self.assertIn("npm ci --silent --prefix otter_tx/test/interop/node", err)

    def test_npmAbsent(self):
        """No npm at all: straight to the tests."""
        self.assertEqual(self.runStep(), (0, "TESTS RUN\n", ""))

    def test_npmWorks(self):
        """npm ci succeeds: the tests run, no failure line."""
        self.fakeNpm(0)
        status, out, err = self.runStep()
        self.assertEqual((status, out), (0, "TESTS RUN\n"), err)
        self.assertIn("npm ci --silent --prefix otter_tx/test/interop/node", err)

"""
Every code example in ``docs/*.md`` runs as written, against a broker on
``tcp:0`` (the convention is in docs/style.md, "Code examples in docs/").

Each fenced block's info string says what it is: its language, then
optionally ``fragment`` (part of a program: a function, a few calls that
need objects made elsewhere) or ``norun`` (a whole command or program this
test cannot run: it starts a broker, runs a benchmark, needs TLS files),
each optionally followed by ``: the reason``.  Blocks in :data:`RUN`'s
languages without a mark are run, one test each, against a fresh
in-process broker with the management API:

- the example's ``localhost:5672`` / ``127.0.0.1:5672`` (AMQP) and
  ``localhost:15672`` / ``127.0.0.1:15672`` (HTTP) become the test broker's
  ports on 127.0.0.1; nothing else is changed;
- ``python`` runs with this interpreter, ``js`` with ``node`` (amqplib from
  ``otter_tx/test/interop/node/node_modules``, skipped naming what to run when
  it is missing, as the amqplib tests are), ``sh`` with ``bash -e``; each in
  its own temporary directory, killed after :data:`TIMEOUT` seconds;
- an example passes when it exits with status 0; examples check what they
  promise with ``assert`` (or exit non-zero) where a wrong answer would not
  raise by itself.

Blocks of the other languages (:data:`NEVER_RUN`: ``text``, ``toml``,
``go``, ...) are never run; a block without an info string, or with a
language or mark this module does not know, fails
:meth:`DocsMarksTests.test_everyBlockMarked`, so every choice is visible in
the Markdown.  The examples use otter_tx-only features (the delayed
exchange), so the module runs against the in-process broker only.
"""

import os
import re
import shutil
import signal
import sys
import tempfile

from twisted.internet import defer, protocol, reactor
from twisted.trial.unittest import SkipTest, SynchronousTestCase

import otter_tx
from otter_tx.test.interop import test_interop_amqplib
from otter_tx.test.interop.support import InteropTestCase, ManagementMixin, inProcessOnly

#: the docs directory of a source checkout (absent from an installed wheel)
DOCS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(otter_tx.__file__)), os.pardir, "docs"))

#: languages whose unmarked blocks are run
RUN = ("python", "sh", "js")

#: languages never run (configuration, output, diagrams, Go)
NEVER_RUN = ("text", "console", "toml", "ini", "json", "go")

#: the marks after the language
MARKS = ("fragment", "norun")

#: commands a shell example may use, with the Debian package that has them
SHELL_TOOLS = (("openssl", "openssl"), ("curl", "curl"), ("rabbitmqadmin", "rabbitmq-server"))

#: seconds an example may take before it is killed and the test fails
TIMEOUT = 60

_FENCE = re.compile(r"^(\s*)```(?!`)(.*)$")


class Block:
    """
    One fenced block: ``path`` (str), ``line`` (1-based line of the opening
    fence), ``info`` (the info string), ``language``, ``mark`` (None,
    ``fragment`` or ``norun``), ``code`` (str, the lines inside).
    """

    def __init__(self, path, line, info, code):
        self.path = path
        self.line = line
        self.info = info.strip()
        words = self.info.split(":", 1)[0].split()
        self.language = words[0] if words else ""
        self.mark = words[1] if len(words) > 1 else None
        self.extra = words[2:]
        self.code = code

    @property
    def where(self):
        return "%s:%d" % (os.path.relpath(self.path, os.path.dirname(DOCS)), self.line)

    @property
    def runnable(self):
        return self.language in RUN and self.mark is None


def blocks(path):
    """Every fenced block of the Markdown file at ``path``, in order (list of :class:`Block`)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    found = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        indent, info = m.groups()
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        code = "\n".join(line[len(indent):] if line.startswith(indent) else line for line in lines[i + 1:j])
        found.append(Block(path, i + 1, info, code + "\n"))
        i = j + 1
    return found


def allBlocks():
    """The blocks of every ``docs/*.md``, or [] without a docs directory."""
    if not os.path.isdir(DOCS):
        return []
    out = []
    for name in sorted(os.listdir(DOCS)):
        if name.endswith(".md"):
            out.extend(blocks(os.path.join(DOCS, name)))
    return out


def pointAt(code, amqpPort, managementPort):
    """``code`` with the documented broker addresses replaced by the test broker's."""
    code = re.sub(r"\b(?:localhost|127\.0\.0\.1):5672\b", "127.0.0.1:%d" % (amqpPort,), code)
    return re.sub(r"\b(?:localhost|127\.0\.0\.1):15672\b", "127.0.0.1:%d" % (managementPort,), code)


class _Collect(protocol.ProcessProtocol):
    """Gathers a child's output; ``done`` fires with ``(stdout, stderr, exit code or signal)``."""

    def __init__(self):
        self.out, self.err = [], []
        self.done = defer.Deferred()

    def outReceived(self, data):
        self.out.append(data)

    def errReceived(self, data):
        self.err.append(data)

    def processEnded(self, reason):
        status = reason.value
        code = status.exitCode if status.exitCode is not None else "signal %s" % (status.signal,)
        self.done.callback((b"".join(self.out), b"".join(self.err), code))


def runBounded(argv, cwd, env, timeout=TIMEOUT):
    """
    Run ``argv`` in ``cwd`` with ``env``; a Deferred firing with ``(stdout,
    stderr, code)`` (bytes, bytes, int or ``"signal N"``).  A child still
    running after ``timeout`` seconds is killed (SIGKILL), which ends it
    with a signal, so the test fails instead of hanging.
    """
    proto = _Collect()
    transport = reactor.spawnProcess(proto, argv[0], argv, env=env, path=cwd)
    killer = reactor.callLater(timeout, transport.signalProcess, signal.SIGKILL)

    def ended(result):
        if killer.active():
            killer.cancel()
        return result

    return proto.done.addBoth(ended)


@inProcessOnly("the docs' examples use otter_tx-only features (the delayed-message exchange, its commands)")
class DocsExamplesTests(ManagementMixin, InteropTestCase):
    """One test per runnable example of docs/*.md (test methods are added below, per block)."""

    timeout = TIMEOUT + 30

    def runBlock(self, block):
        if block.language == "js":
            node = test_interop_amqplib.requireAmqplib()
            argv, suffix = [node], ".js"
            env = {"NODE_PATH": os.path.join(test_interop_amqplib.NODE_DIR, "node_modules")}
        elif block.language == "sh":
            for tool, package in SHELL_TOOLS:
                if re.search(r"(^|[\s;|&(])%s\b" % (tool,), block.code, re.M) and shutil.which(tool) is None:
                    raise SkipTest("%s is not installed: apt-get install %s" % (tool, package))
            argv, suffix, env = [shutil.which("bash") or "/bin/bash", "-e"], ".sh", {}
        else:
            argv, suffix, env = [sys.executable], ".py", {}
        work = tempfile.mkdtemp(prefix="otter-docs-")
        self.addCleanup(shutil.rmtree, work, True)
        script = os.path.join(work, "example" + suffix)
        with open(script, "w", encoding="utf-8") as f:
            f.write(pointAt(block.code, self.fixture.amqpPort, self.fixture.managementPort))
        childEnv = dict(os.environ)
        childEnv.update(env)
        d = runBounded(argv + [script], work, childEnv)

        def check(result):
            out, err, code = result
            if code != 0:
                self.fail("%s (%s) exited with %s\n--- stdout\n%s\n--- stderr\n%s" % (
                    block.where, block.language, code, out.decode("utf-8", "replace"),
                    err.decode("utf-8", "replace")))

        return d.addCallback(check)


def _addTests():
    """A ``test_<file>_<line>`` method on :class:`DocsExamplesTests` for each runnable block."""
    for block in allBlocks():
        if not block.runnable:
            continue
        stem = re.sub(r"\W", "_", os.path.basename(block.path)[:-len(".md")])
        name = "test_%s_%d" % (stem, block.line)

        def test(self, block=block):
            return self.runBlock(block)

        test.__name__ = name
        test.__doc__ = "The %s example at %s runs against the broker and exits 0." % (block.language, block.where)
        setattr(DocsExamplesTests, name, test)


_addTests()


class DocsMarksTests(SynchronousTestCase):
    """Every block in docs/*.md says what it is, so the runner's choice is visible in the Markdown."""

    def test_everyBlockMarked(self):
        """Each fenced block has a known language and at most a known mark (fragment, norun)."""
        found = allBlocks()
        if not found:
            raise SkipTest("no docs/ directory next to the otter_tx package (run from a source checkout)")
        bad = []
        for b in found:
            if not b.language:
                bad.append("%s: no info string (give the language, e.g. ```text)" % (b.where,))
            elif b.language not in RUN + NEVER_RUN:
                bad.append("%s: unknown language %r (known: %s)" % (b.where, b.language, ", ".join(RUN + NEVER_RUN)))
            elif b.extra or (b.mark is not None and b.mark not in MARKS):
                bad.append("%s: %r: after the language only %s, then ': reason'" % (
                    b.where, b.info, " or ".join(MARKS)))
        self.assertEqual(bad, [])

    def test_examplesFound(self):
        """The runner finds the examples it should (so a parsing slip cannot make the suite empty)."""
        if not os.path.isdir(DOCS):
            raise SkipTest("no docs/ directory next to the otter_tx package (run from a source checkout)")
        runnable = {(os.path.basename(b.path), b.language) for b in allBlocks() if b.runnable}
        for expected in (("delayed.md", "python"), ("delayed.md", "js"), ("ttl.md", "python"),
                         ("dead-lettering.md", "python"), ("tls.md", "sh")):
            self.assertIn(expected, runnable)

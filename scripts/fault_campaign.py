#!/usr/bin/env python3
"""Fault campaign for `brigade train` (docs/reliability.md, "Fault campaign").

Runs a tiny GPT recipe (the one of tests/cli/test_recovery.cpp, 40 steps, a checkpoint after
every step) through faults, end to end through the binary, and checks that every fault ends
the way docs/reliability.md says it does:

  reference   two uninterrupted runs: the weights and optimizer state every later check
              compares with (and the proof that they are reproducible, bitwise)
  sigkill     N SIGKILLs at random times (uniform over the run's measured duration), each
              followed by --resume (or a fresh start when no checkpoint exists yet), chains of
              kills until the run completes; every resume must work and every completed chain
              must end with the reference's model and optimizer files, bitwise. A kill is
              "inside a checkpoint write" when <out_dir>/checkpoint.tmp (written by this
              process) or checkpoint.old existed at the moment of the kill: the process is
              stopped (SIGSTOP), the folder looked at, then killed (SIGKILL)
  disk_full   run.out_dir on a small tmpfs (one checkpoint fits, two do not): the run fails
              with one error line, the previous checkpoint is intact (its CRC-32s), and after
              the space is freed --resume completes with the reference's weights
  byte_flip   one byte flipped in the middle of each checkpoint file: --resume fails naming it
  rank_kill   under mpirun -np 2 (dp 2, ZeRO-1): rank 1 killed in the forward, after the
              backward, before the gradient reduction and inside the checkpoint write: the job
              ends non-zero within 10 s of the kill and the last checkpoint resumes to the end
              (with the uninterrupted dp-2 run's weights)
  sigstop     rank 1 stopped, parallel.timeout_s = 5: the job ends within 5 + 5 s naming rank 1
  restarts    --max-restarts 10 with 10 kills (one per attempt, kill_save and kill_backward
              among them): completes with the reference's weights

Plain python3 (standard library only). Every subprocess has a time limit. Prints one line per
trial, a summary table at the end (also WORK/summary.json), and exits 1 when any check fails.

  python3 scripts/fault_campaign.py [--brigade build/bin/brigade] [--work /tmp/brigade-fault-campaign]
                                    [--kills 100] [--seed S] [--only sigkill,byte_flip,...]
"""
import argparse
import glob
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import zlib

STEPS = 40
CHECKPOINT_EVERY = 1
ALL_CHECKS = ["reference", "sigkill", "disk_full", "byte_flip", "rank_kill", "sigstop", "restarts"]

RECIPE = """\
[run]
name = "fault-campaign"
out_dir = "run"
seed = 7
threads = 1
[model]
vocab_size = 128
block_size = 32
n_layer = 2
n_head = 2
n_embd = 32
[data]
corpus = "{corpus}"
dir = "{data}"
val_fraction = 0.1
[train]
steps = {steps}
batch_size = 4
seq_len = 32
eval_every = 0
eval_batches = 2
log_every = 1
checkpoint_every = {checkpoint_every}
[optim]
lr = 3e-3
[schedule]
warmup_steps = 2
min_lr = 3e-4
"""

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_btl": "self,vader"}


def say(line=""):
    print(line, flush=True)


# ---------------------------------------------------------------- processes


def proc_table():
    """pid -> (ppid, state) for every process."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                s = f.read()
        except OSError:
            continue
        rest = s[s.rfind(")") + 2:].split()
        out[int(d)] = (int(rest[1]), rest[0])
    return out


def descendants(pid):
    table = proc_table()
    kids, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c, (pp, _) in table.items():
            if pp == p:
                kids.append(c)
                todo.append(c)
    return kids


def proc_state(pid):
    """'R', 'S', 'T', 'Z', ... or None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
        return s[s.rfind(")") + 2:].split()[0]
    except OSError:
        return None


def all_threads_stopped(pid):
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    states = []
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/stat") as f:
                s = f.read()
            states.append(s[s.rfind(")") + 2:].split()[0])
        except OSError:
            pass
    if any(st == "Z" for st in states) or not states:
        return None
    return all(st in ("T", "t") for st in states)


def rank_of(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
    except OSError:
        return None
    if b"brigade" not in cmd or b"train" not in cmd:
        return None
    for e in env:
        if e.startswith(b"OMPI_COMM_WORLD_RANK="):
            return int(e.split(b"=", 1)[1])
    return None


def kill_pids(pids, sig=signal.SIGKILL):
    for p in pids:
        try:
            os.kill(p, sig)
        except OSError:
            pass


ACTIVE = set()  # runs not finished yet: ended when the campaign itself is interrupted


class Run:
    """One command started in the background, stdout and stderr into log files."""

    def __init__(self, name, argv, env_extra=None, cwd=None, logdir=None):
        self.name = name
        env = dict(os.environ)
        env.pop("BRIGADE_FAULT", None)
        env.pop("BRIGADE_ATTEMPT", None)
        env.update(env_extra or {})
        self.out_path = os.path.join(logdir, name + ".out")
        self.err_path = os.path.join(logdir, name + ".err")
        self.argv = argv
        self.env_extra = env_extra or {}
        self._out = open(self.out_path, "wb")
        self._err = open(self.err_path, "wb")
        self.t0 = time.monotonic()
        self.t0_ns = time.time_ns()
        self.p = subprocess.Popen(argv, stdout=self._out, stderr=self._err, env=env, cwd=cwd,
                                  start_new_session=True)
        self.pid = self.p.pid
        self.rc = None
        self.t1 = None
        self.seen = set([self.pid])  # every process of this run seen so far (for cleanup)
        ACTIVE.add(self)

    def poll(self):
        if self.rc is None:
            rc = self.p.poll()
            if rc is not None:
                self._finish(rc)
        return self.rc

    def _finish(self, rc):
        ACTIVE.discard(self)
        self.rc = rc
        self.t1 = time.monotonic()
        self._out.close()
        self._err.close()

    def wait(self, timeout):
        """Waits up to timeout s; on expiry ends the run (and everything it started) and returns None."""
        try:
            rc = self.p.wait(timeout=timeout)
            self._finish(rc)
            self.cleanup()
            return rc
        except subprocess.TimeoutExpired:
            self.terminate()
            return None

    def wait_for(self, timeout):
        """Waits up to timeout s; returns the exit status, or None when still running."""
        try:
            rc = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        self._finish(rc)
        return rc

    def track(self):
        self.seen.update(descendants(self.pid))

    def terminate(self):
        self.track()
        kill_pids(sorted(self.seen - {self.pid}), signal.SIGCONT)
        kill_pids([self.pid], signal.SIGTERM)
        try:
            self.p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.track()
        kill_pids(sorted(self.seen))
        try:
            rc = self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            rc = -9
        self._finish(rc)
        self.timed_out = True
        return rc

    def cleanup(self):
        """Kills whatever this run left behind (a stopped rank), by the pids seen."""
        left = [p for p in self.seen if p != self.pid and proc_state(p) not in (None, "Z")]
        kill_pids(left)

    @property
    def seconds(self):
        return (self.t1 if self.t1 is not None else time.monotonic()) - self.t0

    def err(self):
        try:
            with open(self.err_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def out(self):
        try:
            with open(self.out_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def command(self):
        env = " ".join(f"{k}='{v}'" for k, v in self.env_extra.items() if not k.startswith("OMPI_"))
        mpi = " ".join(f"{k}={v}" for k, v in self.env_extra.items() if k.startswith("OMPI_"))
        return " ".join(x for x in (mpi, env, " ".join(self.argv)) if x)


def error_lines(text):
    return [l for l in text.splitlines() if "error" in l.lower()]


def first_error(text):
    lines = [l for l in text.splitlines() if l.startswith("brigade: error:") or "brigade: error:" in l]
    if lines:
        return lines[0].strip()
    lines = error_lines(text)
    return lines[0].strip() if lines else (text.strip().splitlines() or [""])[-1]


def short(s, n=300):
    s = " ".join(s.split())
    return s if len(s) <= n else s[:n] + "..."


# ---------------------------------------------------------------- checkpoints


def read_bytes(p):
    try:
        with open(p, "rb") as f:
            return f.read()
    except OSError:
        return None


def ckpt_files(d):
    out = []
    for root, _, files in os.walk(d):
        for f in files:
            out.append(os.path.relpath(os.path.join(root, f), d))
    return sorted(out)


def ckpt_step(d):
    try:
        with open(os.path.join(d, "state.json")) as f:
            return int(json.load(f)["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def verify_crc(d):
    """(ok, what) checking every file listed in checksums.json (the engine's format) ourselves."""
    try:
        with open(os.path.join(d, "checksums.json")) as f:
            j = json.load(f)
    except (OSError, ValueError) as e:
        return False, f"checksums.json unreadable: {e}"
    bad = []
    for rel, want in j.get("files", {}).items():
        b = read_bytes(os.path.join(d, rel))
        if b is None:
            bad.append(f"{rel} missing")
        elif len(b) != want.get("bytes") or "%08x" % (zlib.crc32(b) & 0xFFFFFFFF) != want.get("crc32"):
            bad.append(f"{rel} differs")
    listed = set(j.get("files", {}))
    extra = [f for f in ckpt_files(d) if f != "checksums.json" and f not in listed]
    if bad:
        return False, "; ".join(bad)
    return True, f"{len(listed)} files match their CRC-32" + (f" (unlisted: {extra})" if extra else "")


def weight_files(d):
    return [f for f in ckpt_files(d) if f == "model.safetensors" or f.startswith("optimizer")]


def same_weights(d, ref):
    """(equal, evidence): model and optimizer files of checkpoint d against those of ref, bitwise."""
    names = weight_files(ref)
    diff = []
    for n in names:
        a, b = read_bytes(os.path.join(d, n)), read_bytes(os.path.join(ref, n))
        if a is None:
            diff.append(f"{n} missing")
        elif a != b:
            diff.append(f"{n} differs")
    mine = weight_files(d) if os.path.isdir(d) else []
    extra = [n for n in mine if n not in names]
    if diff or extra or not names:
        return False, "; ".join(diff + [f"{n} not in the reference" for n in extra]) or "no files"
    return True, "bitwise equal: " + ", ".join(names)


def folder_ids(ck):
    """{"tmp": (inode, ctime), "old": ...} of checkpoint.tmp and checkpoint.old beside checkpoint ck, if there."""
    out = {}
    for k in ("tmp", "old"):
        try:
            st = os.stat(f"{ck}.{k}")
            out[k] = (st.st_ino, st.st_ctime_ns)
        except OSError:
            pass
    return out


def dir_pages(d, page=4096):
    total = 0
    for root, _, files in os.walk(d):
        for f in files:
            total += -(-os.path.getsize(os.path.join(root, f)) // page) * page
    return total


# ---------------------------------------------------------------- the campaign


class Campaign:
    def __init__(self, a):
        self.a = a
        self.bin = os.path.abspath(a.brigade)
        self.work = os.path.abspath(a.work)
        self.logs = os.path.join(self.work, "logs")
        self.rng = random.Random(a.seed)
        self.results = []  # {"check", "result", "evidence", ...}
        self.stats = {}
        self.recipe = os.path.join(self.work, "tiny.toml")
        self.ref = None  # the reference checkpoint folder
        self.ref_seconds = None
        self.dp_ref = None
        self.n_runs = 0
        self.last_done = "?"

    # -- helpers

    def record(self, check, ok, evidence, **extra):
        res = "PASS" if ok is True else ("SKIP" if ok is None else "FAIL")
        self.results.append(dict(check=check, result=res, evidence=evidence, **extra))
        say(f"[{res}] {check}: {evidence}")
        return ok

    def out_dir(self, name):
        d = os.path.join(self.work, "runs", name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(os.path.dirname(d), exist_ok=True)
        return d

    def train_argv(self, out, extra=(), mpi=False):
        argv = ["nice", "-n", "10"]
        if mpi:
            argv += ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2"]
        argv += [self.bin, "train", self.recipe, "--quiet", "--no-sample", "--set", f"run.out_dir={out}"]
        if mpi:
            argv += ["--set", "parallel.dp=2", "--set", "parallel.zero=1", "--set", "train.batch_size=2"]
        return argv + list(extra)

    def start(self, name, out, extra=(), fault=None, mpi=False, env=None):
        self.n_runs += 1
        e = dict(MPI_ENV) if mpi else {}
        if fault:
            e["BRIGADE_FAULT"] = fault
        e.update(env or {})
        return Run(f"{self.n_runs:04d}-{name}", self.train_argv(out, extra, mpi), e, cwd=self.work, logdir=self.logs)

    def run(self, name, out, extra=(), fault=None, mpi=False, timeout=None, env=None):
        r = self.start(name, out, extra, fault, mpi, env)
        r.wait(timeout or self.limit())
        return r

    def limit(self, factor=4):
        return 120 + factor * (self.ref_seconds or 60)

    # -- setup

    def setup(self):
        for sub in ("logs", "runs"):  # this script's own folders: each campaign starts clean
            shutil.rmtree(os.path.join(self.work, sub), ignore_errors=True)
        os.makedirs(self.logs, exist_ok=True)
        corpus = os.path.join(self.work, "corpus.txt")
        here = os.path.dirname(os.path.abspath(__file__))
        docs = sorted(glob.glob(os.path.join(here, "..", "docs", "*.md")))
        text = "".join(open(p, encoding="utf-8", errors="replace").read() for p in docs)
        if len(text) < 20000:
            text = (text + "In the beginning was the word, and the word was with the machine.\n") * 2000
        text = text[:100000]
        text = text[: text.rfind("\n") + 1]
        with open(corpus, "w", encoding="utf-8") as f:
            f.write(text)
        with open(self.recipe, "w") as f:
            f.write(RECIPE.format(corpus=corpus, data=os.path.join(self.work, "data"), steps=STEPS,
                                  checkpoint_every=CHECKPOINT_EVERY))
        say(f"corpus: {corpus} ({len(text.encode())} bytes from {len(docs)} files of docs/); recipe: {self.recipe}")
        # prepared once here, so that no timed or killed run spends its time preparing
        self.n_runs += 1
        r = Run(f"{self.n_runs:04d}-prepare", ["nice", "-n", "10", self.bin, "prepare", self.recipe], cwd=self.work,
                logdir=self.logs)
        rc = r.wait(600)
        say(f"brigade prepare: exit {rc} in {r.seconds:.1f} s: " + short(r.err() + r.out(), 200))

    # -- 1. reference

    def check_reference(self):
        runs = []
        for i in range(2):
            out = self.out_dir(f"reference{i}")
            r = self.run(f"reference{i}", out, timeout=900)
            runs.append((out, r))
            say(f"reference run {i}: exit {r.rc} in {r.seconds:.1f} s")
            if r.rc != 0:
                return self.record("reference", False, f"uninterrupted run exited {r.rc}: {short(r.err())}; "
                                   f"command: {r.command()}")
        (out0, r0), (out1, r1) = runs
        self.ref = os.path.join(self.work, "reference-checkpoint")
        shutil.rmtree(self.ref, ignore_errors=True)
        shutil.copytree(os.path.join(out0, "checkpoint"), self.ref)
        self.ref_seconds = max(r0.seconds, r1.seconds)
        step = ckpt_step(self.ref)
        eq, ev = same_weights(os.path.join(out1, "checkpoint"), self.ref)
        files = ckpt_files(self.ref)
        sizes = {f: os.path.getsize(os.path.join(self.ref, f)) for f in files}
        self.stats["reference"] = dict(seconds=[round(r0.seconds, 2), round(r1.seconds, 2)], step=step, files=sizes,
                                       checkpoint_bytes=sum(sizes.values()))
        return self.record("reference", eq and step == STEPS,
                           f"2 uninterrupted runs to step {step} in {r0.seconds:.1f} s / {r1.seconds:.1f} s, "
                           f"{ev if eq else 'NOT reproducible: ' + ev}; checkpoint {sum(sizes.values())} bytes: "
                           + ", ".join(f"{k} {v}" for k, v in sizes.items()))

    # -- 2. SIGKILL campaign

    def check_sigkill(self):
        N = self.a.kills
        # the run's duration, as measured: the median of the last 3 uninterrupted fresh runs (the
        # references first), since a shared machine's load changes it several-fold over a campaign
        durations = list(self.stats["reference"]["seconds"])
        kills = inside = inside_tmp = inside_old = resumes = fresh_restarts = failed = 0
        chains = []
        mismatches = []
        failures = []
        after_final = repairs = 0
        t_start = time.monotonic()
        chain = 0
        while kills < N:
            chain += 1
            out = self.out_dir(f"sigkill-chain{chain:03d}")
            ck = os.path.join(out, "checkpoint")
            trial = 0
            chain_kills = 0
            outcome = None
            while outcome is None:
                trial += 1
                have = ckpt_step(ck) if os.path.isdir(ck) else ckpt_step(ck + ".old")
                if have is not None and have >= STEPS:
                    outcome = "complete (killed after the final checkpoint)"
                    after_final += 1
                    break
                extra = ["--resume"] if have is not None else []
                if trial > 1:
                    if extra:
                        resumes += 1
                    else:
                        fresh_restarts += 1
                how = f"resume from step {have}" if extra else ("fresh" if trial == 1 else "fresh (no checkpoint yet)")
                before = folder_ids(ck)  # what an earlier process left there
                r = self.start(f"sigkill-c{chain:03d}-t{trial:03d}", out, extra)
                if kills < N:
                    D = sorted(durations[-3:])[len(durations[-3:]) // 2]
                    delay = self.rng.uniform(0, D)
                    if r.wait_for(delay) is None:
                        killed = self.stop_look_kill(r, ck, before)
                        if killed is not None:
                            kills += 1
                            chain_kills += 1
                            in_tmp, in_old = killed
                            where = [n for n, f in (("checkpoint.tmp", in_tmp), ("checkpoint.old", in_old)) if f]
                            inside_tmp += in_tmp
                            inside_old += in_old
                            inside += bool(where)
                            say(f"kill {kills:3d}/{N} chain {chain} trial {trial} ({how}): SIGKILL at {delay:5.2f} s "
                                f"of {D:.1f}, "
                                f"{self.last_done} steps logged, inside a checkpoint write: "
                                f"{'yes (' + ' + '.join(where) + ')' if where else 'no'}")
                            repairs += r.err().count("a save was interrupted; restored the previous checkpoint")
                            continue
                if r.rc is None:
                    r.wait(self.limit())
                repairs += r.err().count("a save was interrupted; restored the previous checkpoint")
                # ended on its own
                if r.rc == 0:
                    if trial == 1:
                        durations.append(r.seconds)
                    eq, ev = same_weights(ck, self.ref)
                    outcome = "complete"
                    say(f"chain {chain} trial {trial} ({how}): completed in {r.seconds:.2f} s, exit 0; final "
                        f"weights {'= reference' if eq else 'DIFFER: ' + ev}")
                    if not eq:
                        mismatches.append(f"chain {chain}: {ev} (out dir {out})")
                else:
                    failed += 1
                    outcome = f"failed (exit {r.rc})"
                    failures.append(f"chain {chain} trial {trial} ({how}) exit {r.rc}: {first_error(r.err())}; "
                                    f"command: {r.command()}; log {r.err_path}")
                    say(f"chain {chain} trial {trial} ({how}): FAILED exit {r.rc} after {r.seconds:.2f} s: "
                        f"{first_error(r.err())}")
            if outcome.startswith("complete (killed after"):
                eq, ev = same_weights(ck, self.ref)
                say(f"chain {chain}: killed after its final checkpoint; final weights "
                    f"{'= reference' if eq else 'DIFFER: ' + ev}")
                if not eq:
                    mismatches.append(f"chain {chain}: {ev} (out dir {out})")
            chains.append(dict(chain=chain, kills=chain_kills, trials=trial, outcome=outcome))
            if not outcome.startswith("complete"):
                if chain >= 3 and not any(c["outcome"].startswith("complete") for c in chains):
                    break  # nothing completes: stop instead of looping
        secs = time.monotonic() - t_start
        completed = sum(1 for c in chains if c["outcome"].startswith("complete"))
        self.stats["sigkill"] = dict(kills=kills, inside_checkpoint_write=inside, inside_tmp=inside_tmp,
                                     inside_old=inside_old, resumes=resumes, fresh_restarts=fresh_restarts,
                                     failed_resumes=failed, chains=len(chains), chains_completed=completed,
                                     killed_after_final_checkpoint=after_final, repaired_interrupted_swaps=repairs,
                                     weight_mismatches=len(mismatches),
                                     seconds=round(secs, 1), fresh_run_seconds=[round(x, 2) for x in durations],
                                     failures=failures, mismatches=mismatches)
        ok = kills >= N and failed == 0 and not mismatches and completed == len(chains)
        ev = (f"{kills} SIGKILLs in {len(chains)} chains ({secs:.0f} s), {inside} inside a checkpoint write "
              f"({inside_tmp} with checkpoint.tmp, {inside_old} with checkpoint.old), {resumes} resumes + "
              f"{fresh_restarts} fresh restarts: {failed} failed, {repairs} repaired an interrupted swap; "
              f"{after_final} kills came after the final checkpoint; {completed}/{len(chains)} chains completed, "
              f"{completed - len(mismatches)} with the reference's model and optimizer bitwise, "
              f"{len(mismatches)} differing")
        if failures:
            ev += "; failures: " + " | ".join(failures[:3])
        if mismatches:
            ev += "; mismatches: " + " | ".join(mismatches[:3])
        return self.record("sigkill", ok, ev)

    def stop_look_kill(self, r, ck, before):
        """SIGSTOPs r, looks whether a checkpoint write of this process is under way, SIGKILLs it.
        Returns (checkpoint.tmp of this process exists, checkpoint.old exists), or None when the
        process ended on its own first."""
        try:
            os.kill(r.pid, signal.SIGSTOP)
        except OSError:
            pass
        deadline = time.monotonic() + 5
        stopped = False
        while time.monotonic() < deadline:
            stopped = all_threads_stopped(r.pid)
            if stopped is not False:
                break
            time.sleep(0.002)
        if stopped is None:  # ended on its own just then
            r.wait(self.limit())
            return None
        now = folder_ids(ck)  # a folder counts when this process made it (not one left by an earlier kill)
        in_tmp = "tmp" in now and now["tmp"] != before.get("tmp")
        in_old = "old" in now and now["old"] != before.get("old")
        self.last_done = self.steps_done(os.path.dirname(ck))
        kill_pids([r.pid])
        r.wait(60)
        return in_tmp, in_old

    def steps_done(self, out):
        try:
            with open(os.path.join(out, "metrics.jsonl")) as f:
                steps = [json.loads(l).get("step") for l in f if '"loss"' in l]
            return max([s for s in steps if isinstance(s, int)], default=0)
        except (OSError, ValueError):
            return "?"

    # -- 3. disk full

    def check_disk_full(self):
        base = os.path.join(self.work, "diskfull")
        mnt = os.path.join(base, "mnt")
        os.makedirs(mnt, exist_ok=True)
        self.unmount(mnt)
        ck_pages = dir_pages(self.ref)
        # one checkpoint, half of a second one and room for metrics.jsonl: the first save fits, the
        # second (written beside the first) does not
        size_k = (ck_pages + ck_pages // 2 + 64 * 1024) // 1024
        how, free_cmd, note = None, None, ""
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_k}k", "tmpfs", mnt], capture_output=True,
                           text=True, timeout=30)
        if r.returncode == 0:
            how = f"tmpfs size={size_k}k"
            free_cmd = ["mount", "-o", "remount,size=65536k", mnt]
        else:
            note = f"tmpfs: {r.stderr.strip()}"
            img = os.path.join(base, "disk.img")
            cmds = [["truncate", "-s", "16M", img], ["mkfs.ext4", "-q", "-F", "-m", "0", img],
                    ["mount", "-o", "loop", img, mnt]]
            ok = True
            for c in cmds:
                try:
                    rr = subprocess.run(c, capture_output=True, text=True, timeout=60)
                except (OSError, subprocess.TimeoutExpired) as e:
                    rr = None
                    note += f"; {' '.join(c)}: {e}"
                if rr is None or rr.returncode != 0:
                    note += f"; {' '.join(c)}: {rr.stderr.strip() if rr else ''}"
                    ok = False
                    break
            if not ok:
                return self.record("disk_full", None, f"skipped: cannot mount a small filesystem here ({note})")
            st = os.statvfs(mnt)
            free = st.f_bavail * st.f_frsize
            filler = os.path.join(mnt, "filler")
            with open(filler, "wb") as f:
                f.write(b"\0" * max(0, free - size_k * 1024))
                f.flush()
                os.fsync(f.fileno())
            how = f"loop ext4 image with a filler leaving {size_k} KiB ({note})"
            free_cmd = ["rm", "-f", filler]
        try:
            out = os.path.join(mnt, "run")
            r1 = self.run("diskfull-full", out)
            err = r1.err()
            line = first_error(err)
            ck = os.path.join(out, "checkpoint")
            prev_step = ckpt_step(ck)
            crc_ok, crc_ev = verify_crc(ck) if os.path.isdir(ck) else (False, "no checkpoint folder")
            leftover = [p for p in (ck + ".tmp", ck + ".old") if os.path.exists(p)]
            n_err = len([l for l in err.splitlines() if "brigade: error" in l])
            say(f"disk full ({how}, checkpoint {ck_pages // 1024} KiB in pages): exit {r1.rc} after "
                f"{r1.seconds:.1f} s; error: {line}")
            ok1 = (r1.rc is not None and 1 <= r1.rc <= 127 and n_err == 1 and "space" in line.lower()
                   and prev_step is not None and crc_ok and not leftover)
            fr = subprocess.run(free_cmd, capture_output=True, text=True, timeout=30)
            r2 = self.run("diskfull-resume", out, ["--resume"])
            eq, ev = same_weights(ck, self.ref)
            ok2 = fr.returncode == 0 and r2.rc == 0 and eq
            ev_all = (f"{how}: run exit {r1.rc} with {n_err} error line(s): \"{line}\"; previous checkpoint at step "
                      f"{prev_step}: {crc_ev}; leftover temporary folders: {leftover or 'none'}; space freed "
                      f"({' '.join(free_cmd)}: exit {fr.returncode}); --resume exit {r2.rc} in {r2.seconds:.1f} s "
                      f"to step {ckpt_step(ck)}, final weights {ev}")
            if r2.rc != 0:
                ev_all += f"; resume error: {first_error(r2.err())}"
            self.stats["disk_full"] = dict(fs=how, size_k=size_k, exit=r1.rc, error=line, previous_step=prev_step,
                                           resume_exit=r2.rc, equal=eq)
            return self.record("disk_full", ok1 and ok2, ev_all)
        finally:
            self.unmount(mnt)

    def unmount(self, mnt):
        for _ in range(3):
            if subprocess.run(["mountpoint", "-q", mnt], timeout=10).returncode != 0:
                return
            subprocess.run(["umount", mnt], capture_output=True, timeout=30)

    # -- 4. byte flips

    def check_byte_flip(self):
        files = ckpt_files(self.ref)
        src_out = os.path.join(self.work, "runs", "reference0")
        extra = ["--resume", "--set", f"train.steps={STEPS + 2}"]
        # control: the untouched copy resumes
        out = self.out_dir("flip-control")
        shutil.copytree(self.ref, os.path.join(out, "checkpoint"))
        if os.path.isfile(os.path.join(src_out, "metrics.jsonl")):
            shutil.copy(os.path.join(src_out, "metrics.jsonl"), out)
        rc = self.run("flip-control", out, extra)
        ctl_ok = rc.rc == 0
        self.record("byte_flip/control", ctl_ok, f"untouched copy of the checkpoint: --resume with "
                    f"train.steps={STEPS + 2} exit {rc.rc}" + ("" if ctl_ok else f": {first_error(rc.err())}"))
        all_ok = True
        for rel in files:
            out = self.out_dir("flip-" + rel.replace("/", "_"))
            ck = os.path.join(out, "checkpoint")
            shutil.copytree(self.ref, ck)
            p = os.path.join(ck, rel)
            b = bytearray(read_bytes(p))
            i = len(b) // 2
            before = b[i]
            b[i] ^= 0xFF
            with open(p, "wb") as f:
                f.write(b)
            r = self.run("flip-" + rel.replace("/", "_"), out, extra)
            line = first_error(r.err())
            base = os.path.basename(rel)
            ok = r.rc is not None and 1 <= r.rc <= 127 and base in line
            all_ok &= ok
            self.record(f"byte_flip/{rel}", ok, f"byte {i} of {len(b)} 0x{before:02x} -> 0x{b[i]:02x}: --resume exit "
                        f"{r.rc}: \"{line}\"" + ("" if ok else f" (does not name {base}); command: {r.command()}"))
        return all_ok

    # -- 5. a rank killed in each phase (mpirun)

    def mpi_run_watch(self, name, out, extra=(), fault=None, watch_rank=1, timeout=None):
        """Runs under mpirun, watching rank `watch_rank` and metrics.jsonl. Returns (run, t_gone, t_stopped,
        logged): when the rank's process was first seen gone / stopped and when each step was first seen
        logged, in seconds since the launch."""
        r = self.start(name, out, extra, fault, mpi=True)
        rank_pid, t_gone, t_stop = None, None, None
        logged, pos = {}, 0
        metrics = os.path.join(out, "metrics.jsonl")
        limit = timeout or self.limit()
        n = 0
        while r.poll() is None:
            now = r.seconds
            if now > limit:
                r.terminate()
                break
            if rank_pid is None or n % 25 == 0:
                r.track()
            if rank_pid is None:
                for p in r.seen:
                    if p != r.pid and rank_of(p) == watch_rank:
                        rank_pid = p
            else:
                st = proc_state(rank_pid)
                if t_gone is None and st in (None, "Z", "X"):
                    t_gone = now
                if t_stop is None and st in ("T", "t"):
                    t_stop = now
            try:
                with open(metrics) as f:
                    f.seek(pos)
                    chunk = f.read()
                cut = chunk.rfind("\n") + 1
                pos += len(chunk[:cut].encode())
                for l in chunk[:cut].splitlines():
                    try:
                        j = json.loads(l)
                    except ValueError:
                        continue
                    if "loss" in j and isinstance(j.get("step"), int):
                        logged.setdefault(j["step"], now)
            except OSError:
                pass
            n += 1
            time.sleep(0.02)
        r.track()
        r.cleanup()
        return r, t_gone, t_stop, logged

    def dp_reference(self):
        if self.dp_ref is None:
            out = self.out_dir("dp2-reference")
            r, _, _, _ = self.mpi_run_watch("dp2-reference", out, timeout=900)
            say(f"uninterrupted dp-2 ZeRO-1 run: exit {r.rc} in {r.seconds:.1f} s; checkpoint: "
                f"{', '.join(ckpt_files(os.path.join(out, 'checkpoint')))}")
            self.dp_ref = (os.path.join(out, "checkpoint"), r.seconds, r.rc, r)
        return self.dp_ref

    def check_rank_kill(self):
        ref_ck, ref_s, ref_rc, ref_run = self.dp_reference()
        if ref_rc != 0:
            return self.record("rank_kill", False, f"the uninterrupted mpirun run failed (exit {ref_rc}): "
                               f"{first_error(ref_run.err())}; command: {ref_run.command()}")
        all_ok = True
        for kind, step in (("kill", 5), ("kill_backward", 6), ("kill_reduce", 7), ("kill_save", 8)):
            out = self.out_dir(f"rank-{kind}")
            ck = os.path.join(out, "checkpoint")
            fault = f"1:{step}:{kind}"
            r, t_gone, _, logged = self.mpi_run_watch(f"rank-{kind}", out, fault=fault)
            err = r.err() + r.out()
            died = bool(re.search(r"process rank 1 .*exited on signal 9", err))
            if r.rc == 0 or not died:
                self.stats.setdefault("rank_kill", {})[kind] = dict(exit=r.rc, fired=False)
                all_ok = False
                self.record(f"rank_kill/{kind}", False,
                            f"BRIGADE_FAULT={fault}: job exit {r.rc} after {r.seconds:.1f} s, rank 1 did not die by "
                            f"signal 9: " + ("the job completed, so this binary does not inject " + kind
                                             if r.rc == 0 else first_error(err)) + f"; command: {r.command()}")
                continue
            lag = None if t_gone is None else r.seconds - t_gone
            bound = None if (step - 1) not in logged else r.seconds - logged[step - 1]
            last = ckpt_step(ck)
            crc_ok, crc_ev = verify_crc(ck) if os.path.isdir(ck) else (False, "no checkpoint")
            # the kill's time: rank 1's process gone; else (conservatively) step step-1 logged
            measured = lag if lag is not None else bound
            ok_job = r.rc != 0 and measured is not None and measured <= 10.0
            rr, _, _, _ = self.mpi_run_watch(f"rank-{kind}-resume", out, ["--resume"])
            eq, eq_ev = same_weights(ck, ref_ck)
            ok_resume = rr.rc == 0 and last == step - 1 and crc_ok
            ok = ok_job and ok_resume and eq
            all_ok &= ok
            ev = (f"BRIGADE_FAULT={fault}: rank 1 died by signal 9, job exit {r.rc} after {r.seconds:.1f} s: "
                  + (f"{lag:.2f} s after rank 1's process was gone" if lag is not None else "rank 1 not seen gone")
                  + (f" ({bound:.2f} s after step {step - 1} was logged, an upper bound)" if bound is not None else "")
                  + f"; last checkpoint at step {last} (expected {step - 1}), {crc_ev}; mpirun --resume exit {rr.rc} "
                  f"in {rr.seconds:.1f} s to step {ckpt_step(ck)}, final weights vs the uninterrupted dp-2 run: {eq_ev}")
            if rr.rc != 0:
                ev += f"; resume error: {first_error(rr.err())}; command: {rr.command()}"
            if not ok:
                ev += f"; command: {r.command()}"
            self.stats.setdefault("rank_kill", {})[kind] = dict(
                exit=r.rc, fired=True, seconds=round(r.seconds, 2), after_kill=None if lag is None else round(lag, 2),
                after_last_step_logged=None if bound is None else round(bound, 2), last_checkpoint=last,
                resume_exit=rr.rc, equal=eq)
            self.record(f"rank_kill/{kind}", ok, ev)
        return all_ok

    # -- 6. SIGSTOP

    def check_sigstop(self):
        step = 5
        out = self.out_dir("rank-stop")
        fault = f"1:{step}:stop"
        r, t_gone, t_stop, logged = self.mpi_run_watch("rank-stop", out, ["--set", "parallel.timeout_s=5"],
                                                       fault=fault, timeout=120)
        err = r.err()
        line = next((l for l in err.splitlines() if "not arrived" in l or "parallel.timeout_s" in l), first_error(err))
        names = "rank 1" in line and ("not arrived" in line or "does not answer" in line)
        lag = None if t_stop is None else r.seconds - t_stop
        bound = None if (step - 1) not in logged else r.seconds - logged[step - 1]
        measured = lag if lag is not None else bound
        ok = r.rc not in (None, 0) and names and measured is not None and measured <= 10.0
        self.stats["sigstop"] = dict(exit=r.rc, seconds=round(r.seconds, 2),
                                     after_stop=None if lag is None else round(lag, 2), error=line)
        return self.record("sigstop", ok, f"BRIGADE_FAULT={fault}, parallel.timeout_s=5: job exit {r.rc} "
                           + (f"{lag:.2f} s after rank 1 stopped" if lag is not None else "(rank 1 never seen stopped)")
                           + (f", {bound:.2f} s after step {step - 1} was logged" if bound is not None else "")
                           + f" ({r.seconds:.1f} s from launch); error: \"{line}\""
                           + ("" if ok else f"; command: {r.command()}"))

    # -- 7. --max-restarts

    def check_restarts(self):
        kinds = ["kill", "kill", "kill", "kill_save", "kill", "kill", "kill_backward", "kill", "kill_save", "kill"]
        faults = ",".join(f"0:{3 + 3 * i}:{k}@{i}" for i, k in enumerate(kinds))
        out = self.out_dir("restarts")
        r = self.run("restarts", out, ["--max-restarts", "10"], fault=faults, timeout=self.limit(factor=15))
        err = r.err()
        n = err.count("killed by signal 9")
        from_ck = err.count("from the checkpoint in")
        eq, ev = same_weights(os.path.join(out, "checkpoint"), self.ref)
        ok = r.rc == 0 and n == 10 and eq
        self.stats["restarts"] = dict(exit=r.rc, restarts=n, seconds=round(r.seconds, 1), equal=eq)
        return self.record("restarts", ok, f"BRIGADE_FAULT={faults}: exit {r.rc} in {r.seconds:.1f} s, {n} restarts "
                           f"({from_ck} from a checkpoint), final weights {ev}"
                           + ("" if r.rc == 0 else f"; error: {first_error(err)}")
                           + ("" if ok else f"; command: {r.command()}"))

    # -- all

    def main(self):
        t0 = time.monotonic()
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        only = self.a.only.split(",") if self.a.only else ALL_CHECKS
        say(f"fault campaign: {self.bin}, work {self.work}, seed {self.a.seed}, kills {self.a.kills}, "
            f"checks {','.join(only)}, started {started}")
        if not os.access(self.bin, os.X_OK):
            self.record("binary", False, f"{self.bin} is not an executable")
            return self.finish(t0, started)
        self.setup()
        self.check_reference()
        if self.ref is None:
            return self.finish(t0, started)
        for c in only:
            if c == "reference":
                continue
            say(f"---- {c} ({time.strftime('%H:%M:%S', time.gmtime())} UTC, {time.monotonic() - t0:.0f} s in)")
            try:
                getattr(self, "check_" + c)()
            except Exception as e:  # a campaign bug is a failed check, not a traceback without a summary
                import traceback
                traceback.print_exc()
                self.record(c, False, f"the campaign script failed: {type(e).__name__}: {e}")
        return self.finish(t0, started)

    def finish(self, t0, started):
        secs = time.monotonic() - t0
        fails = [r for r in self.results if r["result"] == "FAIL"]
        summary = dict(binary=self.bin, work=self.work, seed=self.a.seed, kills_requested=self.a.kills,
                       started=started, seconds=round(secs, 1), runs=self.n_runs,
                       passed=sum(r["result"] == "PASS" for r in self.results), failed=len(fails),
                       skipped=sum(r["result"] == "SKIP" for r in self.results), checks=self.results,
                       stats=self.stats)
        os.makedirs(self.work, exist_ok=True)
        with open(os.path.join(self.work, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        say()
        say(f"==== summary ({secs:.0f} s, {self.n_runs} brigade runs, binary {self.bin}, seed {self.a.seed})")
        w = max(len(r["check"]) for r in self.results) if self.results else 10
        for r in self.results:
            say(f"{r['check']:<{w}}  {r['result']}  {r['evidence']}")
        say(f"{summary['passed']} passed, {summary['failed']} failed, {summary['skipped']} skipped; "
            f"{os.path.join(self.work, 'summary.json')}, logs in {self.logs}")
        return 1 if fails else 0


def on_signal(sig, _frame):
    for r in list(ACTIVE):
        r.terminate()
    raise KeyboardInterrupt(f"signal {sig}")


def main():
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--brigade", default="build/bin/brigade")
    ap.add_argument("--work", default="/tmp/brigade-fault-campaign")
    ap.add_argument("--kills", type=int, default=100)
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: from the clock, printed)")
    ap.add_argument("--only", default="", help="comma-separated subset of " + ",".join(ALL_CHECKS))
    a = ap.parse_args()
    if a.seed is None:
        a.seed = int(time.time()) % 100000
    for c in filter(None, a.only.split(",")):
        if c not in ALL_CHECKS:
            ap.error(f"--only {c}: not one of {','.join(ALL_CHECKS)}")
    sys.exit(Campaign(a).main())


if __name__ == "__main__":
    main()

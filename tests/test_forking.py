"""Work beside the process (diagnose.analysis.trace.forking): the same results as in one process,
whatever the children do.

A process forks only without other threads, and this test process has them (earlier tests leave
some): each case runs as a small script in a fresh interpreter, which has none, and prints what
the test checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from diagnose.analysis.trace import forking

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")


def run_fresh(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON object last."""
    child = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-3000:]
    return json.loads(child.stdout.strip().splitlines()[-1])


def test_calls_side_by_side_run_in_other_processes_and_come_back_in_order() -> None:
    out = run_fresh(
        """
        import json, os
        from diagnose.analysis.trace import forking
        calls = [lambda i=i: (i, os.getpid(), [i * 0.1] * 3) for i in range(5)]
        got = forking.side_by_side(calls, processes=3)
        print(json.dumps({"can": forking.can_fork(), "got": got, "me": os.getpid()}))
        """
    )
    assert out["can"] is True
    assert [g[0] for g in out["got"]] == [0, 1, 2, 3, 4]
    assert [g[2] for g in out["got"]] == [[i * 0.1] * 3 for i in range(5)]  # floats exact through the pipe
    assert out["got"][0][1] == out["me"]  # the first here
    assert all(g[1] != out["me"] for g in out["got"][1:])  # the others in children


def test_a_child_that_dies_or_raises_is_computed_again_here() -> None:
    out = run_fresh(
        """
        import json, os
        from diagnose.analysis.trace import forking
        me = os.getpid()
        def dies():
            if os.getpid() != me:
                os._exit(3)  # killed, crashed: no result comes back
            return "computed here"
        def raises():
            raise ValueError(f"raised in {'the parent' if os.getpid() == me else 'a child'}")
        got = forking.side_by_side([lambda: "first", dies])
        try:
            forking.side_by_side([lambda: "first", raises])
            error = None
        except ValueError as exc:
            error = str(exc)
        side = forking.Beside(dies)
        print(json.dumps({"got": got, "error": error, "forked": side.forked, "beside": side.result()}))
        """
    )
    assert out["got"] == ["first", "computed here"]
    assert out["error"] == "raised in the parent"  # as the call made here raises it
    assert out["forked"] is True and out["beside"] == "computed here"


def test_a_process_with_another_thread_computes_everything_itself() -> None:
    out = run_fresh(
        """
        import json, os, threading
        from diagnose.analysis.trace import forking
        stop = threading.Event()
        thread = threading.Thread(target=stop.wait)
        thread.start()
        try:
            got = forking.side_by_side([os.getpid, os.getpid, os.getpid])
            print(json.dumps({"can": forking.can_fork(), "got": got, "me": os.getpid()}))
        finally:
            stop.set()
            thread.join()
        """
    )
    assert out["can"] is False
    assert out["got"] == [out["me"]] * 3


def test_without_fork_beside_computes_here_and_cancel_stops_a_child() -> None:
    here = forking.Beside(os.getpid, fork=False)
    assert not here.forked and here.result() == os.getpid()
    out = run_fresh(
        """
        import json, os, time
        from diagnose.analysis.trace import forking
        side = forking.Beside(lambda: time.sleep(60))
        pid = side.pid
        t = time.perf_counter()
        side.cancel()
        gone = True
        try:
            os.kill(pid, 0)
            gone = False
        except ProcessLookupError:
            pass
        print(json.dumps({"forked": pid is not None, "seconds": time.perf_counter() - t, "gone": gone}))
        """
    )
    assert out["forked"] and out["gone"] and out["seconds"] < 10


@pytest.mark.parametrize("fixture", ["launch_bound", "fp32_transformer"])
def test_a_large_trace_analysed_side_by_side_gives_the_same_report(fixture: str) -> None:
    """The breakdown in a child while the model is built here, and the predictions side by side:
    every field of the report as in one process (the thresholds lowered so that a small
    recorded trace takes the parallel path)."""
    out = run_fresh(
        f"""
        import json
        from diagnose import api
        from diagnose.analysis.trace import forking
        from diagnose.analysis import pipeline
        from diagnose.analysis.prediction import predict
        pipeline.PARALLEL_MIN_EVENTS = predict.PARALLEL_MIN_MODEL = 10**12
        one = api.analyze({str(DATA / fixture)!r}, reanalyze=True).to_dict()
        forked = []
        start = forking.Beside.__init__
        def counted(self, call, fork=True):
            start(self, call, fork)
            forked.append(self.forked)
        forking.Beside.__init__ = counted
        pipeline.PARALLEL_MIN_EVENTS = predict.PARALLEL_MIN_MODEL = 0
        two = api.analyze({str(DATA / fixture)!r}, reanalyze=True).to_dict()
        one.pop("created_at"); two.pop("created_at")
        print(json.dumps({{"same": one == two, "forked": forked, "findings": len(one["findings"])}}))
        """
    )
    assert out["findings"] >= 1
    assert out["forked"] and all(out["forked"])
    assert out["same"]


def test_predictions_side_by_side_are_those_made_one_by_one() -> None:
    """Two rules' predictions (the second from a child): the same findings, predictions, notes
    and considered lines as one by one."""
    out = run_fresh(
        """
        import json
        from diagnose.analysis.prediction import predict
        from diagnose.analysis.verdict.findings import diagnose_symptoms
        from diagnose.analysis.prediction.predict import Predictor
        from diagnose.analysis.prediction.replay import replay_check
        from diagnose.analysis.verdict.rules import load_rules
        from tests.test_replay import SYNCED_LAYERS_VALUES as values, checked_layers, model_of
        from diagnose.analysis.symptoms import symptoms_from_values
        rules = {r.id: r for r in load_rules()}
        model = model_of(checked_layers(sync=True))
        def run():
            d = diagnose_symptoms([rules["LAUNCH001"], rules["SYNC001"]], symptoms_from_values(values), Predictor(model, replay_check(model), 1.0, spread=0.01))
            return [[f.rule_id, f.predicted, f.prediction_note] for f in d.findings], d.considered
        predict.PARALLEL_MIN_MODEL = 10**12
        one = run()
        forks = []
        side_by_side = predict.forking.side_by_side
        def counted(calls, processes=None):
            forks.append(len(calls))
            return side_by_side(calls, processes)
        predict.forking.side_by_side = counted
        predict.PARALLEL_MIN_MODEL = 0
        two = run()
        print(json.dumps({"one": one, "two": two, "forks": forks}))
        """
    )
    assert out["forks"] == [2]
    assert out["one"] == out["two"]
    assert out["one"][1] == ["considered LAUNCH001: predicted 0.27x, slower than the step as it is"]


def test_the_thresholds_keep_small_work_in_one_process() -> None:
    from diagnose.analysis import pipeline
    from diagnose.analysis.prediction import predict

    assert pipeline.PARALLEL_MIN_EVENTS >= 100_000 and predict.PARALLEL_MIN_MODEL >= 10_000
    started = time.perf_counter()
    assert forking.side_by_side([lambda: 1]) == [1]  # one call: no fork
    assert time.perf_counter() - started < 1.0


def test_workers_apply_the_call_in_children_and_answer_in_order() -> None:
    """Round robin over the children, each answering in the order sent; an exception comes back
    raised; a result never asked for (abandoned) is dropped when a later one is asked; no thread
    is started, so the process may still fork; close ends and reaps every child."""
    out = run_fresh(
        """
        import json, os, threading
        from diagnose.analysis.trace import forking
        def work(i, x):
            if i == 3:
                raise ValueError(f"bad {i}")
            return (i, os.getpid(), x * 0.1)
        workers = forking.Workers(work, 2)
        getters = [workers.submit(i, float(i)) for i in range(8)]
        threads = threading.active_count()
        got, errors = [], []
        for i, get in enumerate(getters):
            if i == 4:
                continue  # abandoned: its child's next answer (6) still comes back right
            try:
                got.append(get())
            except ValueError as exc:
                errors.append(str(exc))
        pids = list(workers.pids)
        workers.close()
        alive = []
        for pid in pids:
            try:
                os.kill(pid, 0)
                alive.append(pid)
            except ProcessLookupError:
                pass
        print(json.dumps({"got": got, "errors": errors, "me": os.getpid(), "threads": threads, "can": forking.can_fork(), "alive": alive, "n": len(pids)}))
        """
    )
    assert out["n"] == 2 and out["threads"] == 1 and out["can"] is True
    assert [g[0] for g in out["got"]] == [0, 1, 2, 5, 6, 7]
    assert [g[2] for g in out["got"]] == [i * 0.1 for i in (0, 1, 2, 5, 6, 7)]
    assert {g[1] for g in out["got"]}.isdisjoint({out["me"]}) and len({g[1] for g in out["got"]}) == 2
    assert out["errors"] == ["bad 3"]
    assert out["alive"] == []


def test_a_worker_that_dies_answers_none_for_the_caller_to_compute() -> None:
    out = run_fresh(
        """
        import json, os, signal
        from diagnose.analysis.trace import forking
        workers = forking.Workers(lambda x: x * 2, 2)
        first = [workers.submit(i) for i in range(2)]
        answers = [get() for get in first]
        os.kill(workers.pids[0], signal.SIGKILL)
        os.waitpid(workers.pids[0], 0)
        later = [workers.submit(i) for i in range(2, 6)]  # 2 and 4 go to the dead child
        answers += [get() for get in later]
        workers.close()
        print(json.dumps({"answers": answers}))
        """
    )
    assert out["answers"] == [0, 2, None, 6, None, 10]


def test_shared_slots_carry_bytes_to_workers_forked_after_them() -> None:
    """Bytes written into a slot are read by a child forked after the slots were made; a slot is
    free again once released; none is given when all are taken."""
    out = run_fresh(
        """
        import json
        from diagnose.analysis.trace import forking
        slots = forking.SharedSlots(2, 8)
        workers = forking.Workers(lambda slot, n: slots.read_once(slot, n).decode(), 2)
        def put(data):
            slot = slots.take()
            if slot is not None:
                with slots.view(slot) as view:
                    view[: len(data)] = data
            return slot
        a, b = put(b"first"), put(b"second!!")
        full = put(b"x")
        got = [workers.submit(a, 5)(), workers.submit(b, 8)(), workers.submit(a, 5)()]  # read once by each child
        slots.release(a)
        c = put(b"third")
        got.append(workers.submit(c, 5)())
        workers.close()
        slots.close()
        print(json.dumps({"got": got, "full": full, "reused": c == a}))
        """
    )
    assert out == {"got": ["first", "second!!", "first", "third"], "full": None, "reused": True}


def test_workers_read_every_answer_already_sent_when_one_is_asked_for() -> None:
    """An answer larger than a pipe holds keeps its child from its next task until read: asking
    for one answer reads the others that are ready (in their children's order), so that the
    children go on while this process takes its answers in its own order."""
    out = run_fresh(
        """
        import json, time
        from diagnose.analysis.trace import forking
        workers = forking.Workers(lambda i: (i, b"x" * 2_000_000), 2)
        getters = [workers.submit(i) for i in range(4)]
        time.sleep(1.0)  # every child has sent its first answer and waits to send it whole
        first = getters[0]()[0]
        read_ahead = [len(a) for a in workers._answers]
        rest = [get()[0] for get in getters[1:]]
        workers.close()
        print(json.dumps({"first": first, "read_ahead": read_ahead, "rest": rest}))
        """
    )
    assert out["first"] == 0 and out["rest"] == [1, 2, 3]
    assert out["read_ahead"][1] >= 1  # child 1's answer was read while answer 0 was asked for

"""The world-size check on a script that follows none of the dtype hooks: the float64 replay
cannot tell rounding from a real dependence there, so the difference is judged against the
noise floor, how far fp32 reordering alone moves the run (`lockstep.checks.noise_floor`).
examples/train_hf_trainer.py without its LOCKSTEP_DTYPE hook passes 1 against 2 ranks even
compared bitwise; the same script clipping on a rank-local shard fails. A replay that crashes
(the script's own float32 assert) leaves the check its verdict and `check all` goes on."""

from pathlib import Path

from support.script_check import EXAMPLE, check

HF = Path(__file__).resolve().parents[2] / "examples" / "train_hf_trainer.py"
HOOK = (
    'if track.replay_dtype() == "float64":  # lockstep: a failed world-size check\'s float64 '
    "replay\n    model = model.double()\n"
)
TRAINER = (
    "trainer = Trainer(model=model, args=args, train_dataset=Synthetic(), "
    "callbacks=[LockstepCallback()])\n"
)
# the bug: after the Trainer's own clipping, each rank clips its own shard of the parameters
# by that shard's norm (on one rank: every parameter, by the whole norm)
LOCAL_CLIP = """from transformers import TrainerCallback


class LocalClip(TrainerCallback):
    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        shard = list(model.parameters())[int(os.environ.get("RANK", "0")) :: WORLD]
        torch.nn.utils.clip_grad_norm_(shard, 0.7)


trainer = Trainer(model=model, args=args, train_dataset=Synthetic(),
                  callbacks=[LockstepCallback(), LocalClip()])
"""
BITWISE = ("--rtol", "0", "--atol", "0")


def without_hook(tmp_path: Path, bug: bool = False) -> Path:
    source = HF.read_text()
    assert source.count(HOOK) == 1 and source.count(TRAINER) == 1, "the example changed"
    source = source.replace(HOOK, "")
    path = tmp_path / ("train_local_clip.py" if bug else "train_no_hook.py")
    path.write_text(source.replace(TRAINER, LOCAL_CLIP) if bug else source)
    return path


def test_hookless_trainer_passes_within_its_noise_floor(tmp_path):
    script = without_hook(tmp_path)
    proc, results = check("world-size", "--script", str(script), "--run-path", *BITWISE,
                          cwd=tmp_path, steps="8")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (result,) = results
    assert result["verdict"] == "pass" and "noise floor" in result["summary"], result
    assert result["forensics"]["verdict"]["kind"] == "unavailable"  # the replay cannot judge
    floor = result["forensics"]["noise_floor"]
    assert max(f for m in floor["floor"]["steps"].values() for f in m.values()) > 0
    assert floor["judgement"]["kind"] == "noise" and floor["judgement"]["ratio"] <= 10


def test_a_rank_local_clip_within_100x_the_floor_fails(tmp_path):
    script = without_hook(tmp_path, bug=True)
    proc, results = check("world-size", "--script", str(script), "--run-path", *BITWISE,
                          cwd=tmp_path, steps="8")  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (result,) = results
    judgement = result["forensics"]["noise_floor"]["judgement"]
    assert judgement["kind"] == "beyond" and 10 < judgement["ratio"] <= 100, judgement
    assert "FAIL world-size" in proc.stdout and "noise floor" in result["diagnosis"]


def test_a_crashing_replay_leaves_the_verdict_and_check_all_goes_on(tmp_path):
    """A rank-local clip in examples/train_protocol.py, which asserts its parameters are
    float32: the float64 replay dies on the assert; the world-size check still FAILs (by the
    noise floor), says the replay could not run, and replicas still runs."""
    source = EXAMPLE.read_text()
    clip = "clip_grad_norm_(model.parameters(), MAX_NORM)"
    build = "opt = torch.optim.AdamW(model.parameters(), lr=0.05)\n"
    assert source.count(clip) == source.count(build) == 1
    source = source.replace(clip, "clip_grad_norm_(list(model.parameters())[rank::world], 0.1)")
    assert_f32 = "assert next(model.parameters()).dtype == torch.float32, 'float32 only'\n"
    script = tmp_path / "train_f32_only.py"
    script.write_text(source.replace(build, build + assert_f32))
    proc, results = check("all", "--script", str(script), "--nproc", "2", "--run-path",
                          cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    verdicts = {r["check"]: r["verdict"] for r in results}
    assert list(verdicts) == ["determinism", "resume", "world-size", "replicas"], verdicts
    assert verdicts["world-size"] == verdicts["replicas"] == "fail", verdicts
    (world,) = [r for r in results if r["check"] == "world-size"]
    replay = world["forensics"]["verdict"]["text"]
    assert "could not run" in replay and "float32 only" in replay, replay
    assert world["forensics"]["noise_floor"]["judgement"]["kind"] == "beyond"

"""Checkpoint files on disk, with real checkpoints of the reference job (ddp, one gloo rank,
in-process): a same-step re-save killed (SIGKILL) at every file operation never leaves `latest`
naming a missing or partial checkpoint; retention and resume leave folders lockstep did not
write alone; a pickle planted in a checkpoint is refused, not run."""

import json
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch

from lockstep.errors import UsageError
from lockstep.train import checkpoint
from lockstep.train.config import from_dict
from lockstep.train.trainer import run_training

STEP2 = "step_00000002"


def config(**checkpointing):
    return from_dict(
        {
            "device": "cpu",
            "steps": checkpointing.pop("steps", 2),
            "logging": {"wandb": "disabled", "progress": False},
            "checkpoint": {"at_end": False, "every": 2, **checkpointing},
        }
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A run's checkpoint folder after 2 steps: step_00000002 and `latest`."""
    out = tmp_path_factory.mktemp("saved")
    run_training(config(), out)
    assert (out / "checkpoints" / checkpoint.LATEST).read_text().strip() == STEP2
    return out / "checkpoints"


def _published(root: Path) -> dict:
    """The manifest of the checkpoint `latest` names, after re-hashing every file."""
    return checkpoint.verify(checkpoint.find(root, "auto"))


MUTATIONS = ("replace", "rename", "link", "unlink", "rmdir", "mkdir")


def _publish_killed_at(root: Path, tmp: Path, n: int) -> bool:
    """Fork; in the child, publish `tmp` as step 2 and SIGKILL it at its n-th file operation
    (rename, link, unlink, mkdir...: every step of it, the removal of each old file included).
    Whether the child was killed (False: it finished in fewer operations)."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            count = 0
            for name in MUTATIONS:
                real = getattr(os, name)

                def killing(*args, _real=real, **kwargs):
                    nonlocal count
                    count += 1
                    if count == n:
                        os.kill(os.getpid(), signal.SIGKILL)
                    return _real(*args, **kwargs)

                setattr(os, name, killing)
            checkpoint.publish(root, tmp, STEP2)
            os._exit(0)
        except BaseException:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return True
    assert os.WEXITSTATUS(status) == 0, "publish failed in the child"
    return False


def test_a_same_step_resave_killed_anywhere_leaves_latest_on_a_complete_checkpoint(saved, tmp_path):
    """The old publication removed step_00000002 before renaming the new one into place: a
    kill in between left `latest` naming a checkpoint that no longer existed."""
    killed = 0
    for n in range(1, 200):
        root = tmp_path / f"kill-{n}"
        shutil.copytree(saved, root)
        tmp = root / f".tmp-{STEP2}"
        shutil.copytree(root / STEP2, tmp)  # the re-save's complete new checkpoint
        manifest = json.loads((tmp / checkpoint.MANIFEST).read_text())
        manifest["resaved"] = True  # tells the new checkpoint from the old one
        (tmp / checkpoint.MANIFEST).write_text(json.dumps(manifest))
        if not _publish_killed_at(root, tmp, n):
            break
        killed += 1
        found = _published(root)  # latest names a complete checkpoint of step 2, old or new
        assert found["step"] == 2, n
    else:
        pytest.fail("publish never finished")
    assert killed > 10  # every link, unlink and rename of the swap was a kill point
    assert _published(root).get("resaved") is True
    assert sorted(p.name for p in root.iterdir()) == [checkpoint.LATEST, STEP2]


def test_a_same_step_resave_and_a_resume_from_it(saved, tmp_path):
    """A fresh run (resume=never) into a folder that holds step 2 saves step 2 again; the next
    run resumes from it through lockstep's weights-only loads (RNG, trainer state)."""
    out = tmp_path / "run"
    shutil.copytree(saved, out / "checkpoints")
    before = (out / "checkpoints" / STEP2 / checkpoint.MANIFEST).stat().st_ino
    first = run_training(config(resume="never"), out)
    root = out / "checkpoints"
    assert (root / STEP2 / checkpoint.MANIFEST).stat().st_ino != before  # really re-saved
    assert sorted(p.name for p in root.iterdir()) == [checkpoint.LATEST, STEP2]
    assert _published(root)["step"] == 2
    resumed = run_training(config(steps=4), out)
    assert resumed.start_step == 2 and [s.step for s in resumed.steps] == [3, 4]
    assert first.final_step == 2


def test_retention_and_resume_leave_folders_lockstep_did_not_write(tmp_path):
    """`keep` used to delete the oldest `step_*` folders by name, whoever wrote them: a user's
    `step_5` and `step_00000099` sort after lockstep's own, so all of lockstep's went, the one
    `latest` named included; and with no `latest` yet, a foreign `step_5` stopped the run."""
    root = tmp_path / "checkpoints"
    for name in ("step_5", "step_00000099"):
        (root / name).mkdir(parents=True)
        (root / name / "notes.txt").write_text("mine\n")
    run_training(config(steps=4, every=1, keep=2), tmp_path)
    assert sorted(p.name for p in root.iterdir()) == [
        checkpoint.LATEST, "step_00000003", "step_00000004", "step_00000099", "step_5",
    ]  # fmt: skip
    assert (root / "step_5" / "notes.txt").read_text() == "mine\n"
    assert _published(root)["step"] == 4


class Planted:
    """What an attacker with write access to a shared checkpoint folder puts in a .pt file:
    unpickling it makes a directory (it could as well run a shell)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


@pytest.mark.parametrize("victim", ["rng/rank00000.pt", "trainer_state.pt"])
def test_a_pickle_planted_in_a_checkpoint_is_refused_not_run(saved, tmp_path, victim):
    out = tmp_path / "run"
    root = out / "checkpoints"
    shutil.copytree(saved, root)
    (file,) = (root / STEP2).glob(f"**/{victim}")
    marker = tmp_path / "pwned"
    state = torch.load(file, weights_only=False) | {"extra": Planted(marker)}
    torch.save(state, file)
    manifest = json.loads((root / STEP2 / checkpoint.MANIFEST).read_text())
    rel = str(file.relative_to(root / STEP2))
    manifest["files"][rel] = [file.stat().st_size, checkpoint._sha256(file)]  # passes verify
    (root / STEP2 / checkpoint.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(UsageError, match=f"{victim}: refusing to unpickle it"):
        run_training(config(steps=4), out)
    assert not marker.exists()
    assert not torch.distributed.is_initialized()

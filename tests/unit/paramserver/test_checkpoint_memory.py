"""What a replica keeps between a job's checkpoints goes with the job's model."""

from __future__ import annotations

from services.paramserver import checkpointing
from services.paramserver.job import JobModel
from stalwart import checkpoint as ckpt

from .builders import header, initial_params, sgd


def test_a_deleted_jobs_snapshot_buffers_and_patch_bases_are_dropped():
    init = initial_params()
    model = JobModel(header(sgd(lr=0.1), init), init)
    snapshot = checkpointing.take_snapshot(model)
    # as a save leaves them: the snapshot's buffers and the chunks stored whole
    checkpointing._SPARE[model.job_id] = snapshot.tensors
    checkpointing._BASES.setdefault(model.job_id, ckpt.PatchBase())
    checkpointing._SPARE["other"] = {}

    checkpointing.forget(model.job_id)
    assert model.job_id not in checkpointing._SPARE
    assert model.job_id not in checkpointing._BASES
    assert "other" in checkpointing._SPARE  # another job's are kept
    checkpointing.forget("other")
    checkpointing.forget("never-saved")  # nothing kept: nothing to do

"""An error's message and ErrorInfo values fit in gRPC's trailing metadata."""

from __future__ import annotations

from google.rpc import error_details_pb2, status_pb2

from stalwart.errors import MAX_MESSAGE_BYTES, ErrorKind, StalwartError, clip


def test_short_text_is_kept_as_it_is():
    assert clip("job 'a' not found", 1024) == "job 'a' not found"


def test_long_text_is_cut_and_says_how_much_is_missing():
    text = "x" * 5000
    clipped = clip(text, 100)
    assert clipped == "x" * 100 + "... (4900 more characters)"


def test_a_character_is_never_cut_in_half():
    clipped = clip("é" * 100, 51)  # two bytes each: 25 fit, the 26th would be half
    assert clipped.startswith("é" * 25 + "...") and "75 more characters" in clipped


def test_a_status_echoing_a_huge_id_stays_small_and_keeps_its_reason():
    job_id = "j" * 200_000
    status = StalwartError(ErrorKind.UNKNOWN_JOB, f"job {job_id!r} not found", job=job_id)
    grpc_status = status.to_status()
    message_header = grpc_status.details
    trailers = dict(grpc_status.trailing_metadata)
    details = status_pb2.Status.FromString(trailers["grpc-status-details-bin"])
    info = error_details_pb2.ErrorInfo()
    details.details[0].Unpack(info)
    assert info.reason == "UNKNOWN_JOB" and len(info.metadata["job"]) < 300
    assert len(message_header.encode()) <= MAX_MESSAGE_BYTES + 40
    assert len(trailers["grpc-status-details-bin"]) < 2 * MAX_MESSAGE_BYTES

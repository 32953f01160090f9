package dev.stalwart.client;

import dev.stalwart.v1.CoordinatorServiceGrpc;
import dev.stalwart.v1.CoordinatorServiceGrpc.CoordinatorServiceBlockingStub;
import dev.stalwart.v1.CreateJobRequest;
import dev.stalwart.v1.GetJobRequest;
import dev.stalwart.v1.GetShardMapRequest;
import dev.stalwart.v1.GetShardMapResponse;
import dev.stalwart.v1.Job;
import dev.stalwart.v1.JobSpec;
import dev.stalwart.v1.JobState;
import dev.stalwart.v1.ListJobsRequest;
import dev.stalwart.v1.ListJobsResponse;
import io.grpc.ManagedChannel;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.util.ArrayDeque;
import java.util.Deque;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;

/**
 * The coordinator replicas as one service: each call goes to the leader, following
 * {@code NOT_LEADER} to the replica it names (or the next one), and past a replica that is
 * down ({@code UNAVAILABLE}). Any other refusal is thrown as it came.
 */
public final class Coordinator implements AutoCloseable {
  private final List<String> addresses;
  private final long deadlineMs;
  private final Map<String, ManagedChannel> channels = new HashMap<>();
  private String leader;

  public Coordinator(List<String> addresses, long deadlineMs) {
    if (addresses.isEmpty()) {
      throw new IllegalArgumentException("no coordinator address");
    }
    this.addresses = List.copyOf(addresses);
    this.deadlineMs = deadlineMs;
    this.leader = addresses.get(0);
  }

  public Job createJob(String jobId, String requestId, JobSpec spec) {
    CreateJobRequest request =
        CreateJobRequest.newBuilder().setJobId(jobId).setRequestId(requestId).setSpec(spec).build();
    return call(stub -> stub.createJob(request)).getJob();
  }

  public Job getJob(String jobId) {
    return call(stub -> stub.getJob(GetJobRequest.newBuilder().setJobId(jobId).build())).getJob();
  }

  public ListJobsResponse listJobs() {
    return call(stub -> stub.listJobs(ListJobsRequest.getDefaultInstance()));
  }

  public GetShardMapResponse getShardMap(String jobId) {
    return call(stub -> stub.getShardMap(GetShardMapRequest.newBuilder().setJobId(jobId).build()));
  }

  /** Poll the job until it finishes; while the replicas elect a leader, keep polling. */
  public Job waitJob(String jobId, long pollMs, long timeoutMs) throws InterruptedException {
    long end = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeoutMs);
    while (true) {
      try {
        Job job = getJob(jobId);
        if (finished(job.getState())) {
          return job;
        }
      } catch (StatusRuntimeException e) {
        if (!transient_(e)) {
          throw e;
        }
      }
      if (System.nanoTime() > end) {
        throw new IllegalStateException("job " + jobId + " not finished within " + timeoutMs + " ms");
      }
      Thread.sleep(pollMs);
    }
  }

  private static boolean finished(JobState state) {
    return state == JobState.JOB_STATE_SUCCEEDED
        || state == JobState.JOB_STATE_FAILED
        || state == JobState.JOB_STATE_CANCELLED;
  }

  private static boolean transient_(StatusRuntimeException e) {
    return "NOT_LEADER".equals(ErrorReason.of(e).reason())
        || e.getStatus().getCode() == Status.Code.UNAVAILABLE;
  }

  <T> T call(Function<CoordinatorServiceBlockingStub, T> fn) {
    Deque<String> queue = new ArrayDeque<>();
    queue.add(leader);
    queue.addAll(addresses);
    Set<String> tried = new HashSet<>();
    StatusRuntimeException last = null;
    while (!queue.isEmpty()) {
      String address = queue.poll();
      if (address.isEmpty() || !tried.add(address)) {
        continue;
      }
      try {
        T out = fn.apply(stub(address));
        leader = address;
        return out;
      } catch (StatusRuntimeException e) {
        last = e;
        ErrorReason why = ErrorReason.of(e);
        if ("NOT_LEADER".equals(why.reason())) {
          queue.addFirst(why.metadata().getOrDefault("leader", ""));
        } else if (e.getStatus().getCode() != Status.Code.UNAVAILABLE) {
          throw e;
        }
      }
    }
    if (last != null) {
      throw last;
    }
    throw Status.UNAVAILABLE.withDescription("no coordinator answered: " + addresses).asRuntimeException();
  }

  private CoordinatorServiceBlockingStub stub(String address) {
    ManagedChannel channel = channels.computeIfAbsent(address, Channels::open);
    return CoordinatorServiceGrpc.newBlockingStub(channel)
        .withDeadlineAfter(deadlineMs, TimeUnit.MILLISECONDS);
  }

  @Override
  public void close() {
    channels.values().forEach(Channels::close);
    channels.clear();
  }
}

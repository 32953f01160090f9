package dev.stalwart.client;

import dev.stalwart.v1.Job;
import dev.stalwart.v1.JobSpec;
import dev.stalwart.v1.JobState;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.List;
import java.util.Map;

/**
 * The Java client against a live cluster, as tests/integration/test_java_client.py runs it:
 * STALWART_COORDINATOR (comma-separated replicas) and STALWART_WEIGHTS_OUT (where the final
 * weights go, for the Python side to compare bitwise). Prints "PASS name" per check; the
 * first failure prints "FAIL name: why" and exits 1.
 */
public final class Smoke {
  private static final long DEADLINE_MS = 30_000;

  private Smoke() {}

  public static void main(String[] args) throws Exception {
    List<String> addresses = Arrays.asList(env("STALWART_COORDINATOR").split(","));
    Path weightsOut = Path.of(env("STALWART_WEIGHTS_OUT"));
    try (Coordinator coordinator = new Coordinator(addresses, DEADLINE_MS)) {
      check("list jobs through the leader", coordinator::listJobs);
      check("a bad spec is refused INVALID_ARGUMENT with its reason", () -> badSpec(coordinator));
      String requestId = "java-" + System.nanoTime();
      JobSpec spec = JobSpec.newBuilder().setModel("mlp").setSteps(5).setSeed(11).build();
      Job job = coordinator.createJob("", requestId, spec);
      check("submit fills in the defaults", () -> {
        require(job.getSpec().getBatchSize() > 0 && job.getSpec().getOptimizer().getLr() > 0,
            "no defaults in " + job.getSpec());
      });
      check("the same request id gives the same job", () -> {
        String again = coordinator.createJob("", requestId, spec).getJobId();
        require(again.equals(job.getJobId()), again + " != " + job.getJobId());
      });
      Job done = coordinator.waitJob(job.getJobId(), 500, 600_000);
      check("the job succeeds at step 5", () -> {
        require(done.getState() == JobState.JOB_STATE_SUCCEEDED && done.getStep() == 5,
            "ended " + done.getState() + " at step " + done.getStep() + ": " + done.getReason());
      });
      Map<String, Weights.Tensor> weights = Weights.pullJob(coordinator, job.getJobId(), DEADLINE_MS);
      Weights.writeJson(weightsOut, job.getJobId(), weights);
      System.out.println("PASS pull " + weights.size() + " tensors of job " + job.getJobId());
    }
  }

  private static void badSpec(Coordinator coordinator) {
    JobSpec bad = JobSpec.newBuilder().setModel("mlp").setSteps(-1).build();
    try {
      coordinator.createJob("", "java-bad-" + System.nanoTime(), bad);
    } catch (StatusRuntimeException e) {
      ErrorReason why = ErrorReason.of(e);
      require(e.getStatus().getCode() == Status.Code.INVALID_ARGUMENT, "code " + e.getStatus());
      require("INVALID_ARGUMENT".equals(why.reason()), "reason " + why.reason());
      require(e.getStatus().getDescription().contains("steps"), e.getStatus().getDescription());
      return;
    }
    throw new AssertionError("steps -1 was admitted");
  }

  private interface Check {
    void run() throws Exception;
  }

  private static void check(String name, Check body) {
    try {
      body.run();
    } catch (Exception | AssertionError e) {
      System.out.println("FAIL " + name + ": " + e);
      System.exit(1);
    }
    System.out.println("PASS " + name);
  }

  private static void require(boolean condition, String why) {
    if (!condition) {
      throw new AssertionError(why);
    }
  }

  private static String env(String name) {
    String value = System.getenv(name);
    if (value == null || value.isEmpty()) {
      System.err.println("Error: " + name + " is not set");
      System.exit(2);
    }
    return value;
  }
}

// What a TypeScript user does against a live cluster, from the generated client
// and the helpers alone: list nodes, submit a job leaving the optional fields to
// the coordinator's defaults, follow it to the end, and pull its final weights
// (every chunk's CRC32C checked). Writes the weights as JSON for the caller to
// compare; prints one line per stage. Exit status 1 on any failure.
//
//   STALWART_COORDINATOR=host:port[,host:port] STALWART_WEIGHTS_OUT=w.json \
//     node dist/scripts/live.js [steps]

import { writeFileSync } from "node:fs";
import { Coordinator, pullWeights } from "../src/index";
import { JobState, jobStateToJSON } from "../src/gen/stalwart/v1/coordinator";
import { NodeRole, nodeRoleToJSON, dtypeToJSON } from "../src/gen/stalwart/v1/common";

async function main(): Promise<void> {
  const addresses = process.env.STALWART_COORDINATOR ?? "";
  const out = process.env.STALWART_WEIGHTS_OUT ?? "";
  if (!addresses || !out) {
    throw new Error("set STALWART_COORDINATOR and STALWART_WEIGHTS_OUT");
  }
  const steps = Number(process.argv[2] ?? "5");
  const coord = new Coordinator(addresses, { callTimeoutMs: 30_000 });
  try {
    const nodes = await coord.listNodes();
    const roles = nodes.map((n) => nodeRoleToJSON(n.role)).sort();
    console.log(`nodes: ${nodes.length} ${roles.join(",")}`);
    if (!nodes.some((n) => n.role === NodeRole.NODE_ROLE_TRAINER)) {
      throw new Error("no trainer registered");
    }
    const requestId = `ts-live-${Date.now()}`;
    const job = await coord.submitJob({ model: "mlp", steps, seed: 7 }, requestId);
    const again = await coord.submitJob({ model: "mlp", steps, seed: 7 }, requestId);
    if (again.jobId !== job.jobId) {
      throw new Error(`retried submit gave job ${again.jobId}, not ${job.jobId}`);
    }
    const s = job.spec;
    console.log(
      `submitted: ${job.jobId} slots=${s?.numSlots} batch=${s?.batchSize} optimizer=${s?.optimizer?.kind} lr=${s?.optimizer?.lr}`,
    );
    const done = await coord.waitJob(job.jobId, 600_000);
    console.log(`finished: ${jobStateToJSON(done.state)} step=${done.step} ${done.reason}`);
    if (done.state !== JobState.JOB_STATE_SUCCEEDED) {
      throw new Error(`job ended ${jobStateToJSON(done.state)}: ${done.reason}`);
    }
    const { versions, tensors } = await pullWeights(coord, job.jobId);
    console.log(`pulled: ${tensors.size} tensors at versions ${versions.join(",")}`);
    const dump = {
      job_id: job.jobId,
      leader: coord.leaderAddress,
      spec: { num_slots: s?.numSlots, batch_size: s?.batchSize, lr: s?.optimizer?.lr },
      tensors: [...tensors.values()].map((t) => ({
        name: t.spec.name,
        dtype: dtypeToJSON(t.spec.dtype),
        shape: t.spec.shape,
        data: t.data.toString("base64"),
      })),
    };
    writeFileSync(out, JSON.stringify(dump));
  } finally {
    coord.close();
  }
}

main().catch((err) => {
  console.error(`live: ${err instanceof Error ? err.message : err}`);
  process.exit(1);
});

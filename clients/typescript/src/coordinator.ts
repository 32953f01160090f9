// The coordinator group from TypeScript: calls go to whichever replica leads.
// A standby answers FAILED_PRECONDITION [NOT_LEADER] with the leader's address
// in ErrorInfo metadata "leader"; the call is sent there instead. A replica
// that is down (UNAVAILABLE) is skipped for the next one.

import { type Metadata, status } from "@grpc/grpc-js";
import {
  CoordinatorServiceClient,
  type GetShardMapResponse,
  type Job,
  JobState,
  JobSpec,
  type Node,
} from "./gen/stalwart/v1/coordinator";
import { StalwartError, toStalwartError } from "./errors";
import { CHANNEL_OPTIONS, callMetadata, callOptions, channelCredentials, type Options } from "./dial";

type Unary<Req, Res> = (
  request: Req,
  metadata: Metadata,
  options: object,
  callback: (err: Error | null, response: Res) => void,
) => unknown;

export const FINISHED_STATES = new Set([
  JobState.JOB_STATE_SUCCEEDED,
  JobState.JOB_STATE_FAILED,
  JobState.JOB_STATE_CANCELLED,
]);

export class Coordinator {
  private readonly addresses: string[];
  private readonly clients = new Map<string, CoordinatorServiceClient>();
  private leader = "";

  /** addresses: the replicas ("host:port", a comma-separated list works too). */
  constructor(
    addresses: string[] | string,
    private readonly opts: Options = {},
  ) {
    const list = typeof addresses === "string" ? [addresses] : addresses;
    this.addresses = list.flatMap((a) => a.split(",")).map((a) => a.trim()).filter(Boolean);
  }

  close(): void {
    for (const client of this.clients.values()) {
      client.close();
    }
    this.clients.clear();
  }

  /** Address of the replica that answered last (the leader once a call succeeded). */
  get leaderAddress(): string {
    return this.leader;
  }

  private client(address: string): CoordinatorServiceClient {
    let client = this.clients.get(address);
    if (client === undefined) {
      client = new CoordinatorServiceClient(address, channelCredentials(this.opts), CHANNEL_OPTIONS);
      this.clients.set(address, client);
    }
    return client;
  }

  /**
   * One unary call, following NOT_LEADER hints and skipping replicas that are down.
   * While no replica leads (NOT_LEADER with no leader named, or every replica
   * down: an election in progress) the call is tried again, for up to
   * opts.retryForMs (default 15 s), as coordinator.proto asks of clients.
   */
  async call<Req, Res>(pick: (c: CoordinatorServiceClient) => Unary<Req, Res>, request: Req): Promise<Res> {
    const until = Date.now() + (this.opts.retryForMs ?? 15_000);
    let pauseMs = 50;
    for (;;) {
      try {
        return await this.callOnce(pick, request);
      } catch (err) {
        if (!transient(err) || Date.now() > until) {
          throw err;
        }
      }
      await new Promise((r) => setTimeout(r, pauseMs));
      pauseMs = Math.min(2 * pauseMs, 1000);
    }
  }

  /** One pass over the replicas: the leader first, then each hint and address once. */
  private async callOnce<Req, Res>(
    pick: (c: CoordinatorServiceClient) => Unary<Req, Res>,
    request: Req,
  ): Promise<Res> {
    const tried = new Set<string>();
    const queue = [this.leader, ...this.addresses];
    let last: unknown = new Error("no coordinator replica to call");
    while (queue.length > 0) {
      const address = queue.shift() as string;
      if (!address || tried.has(address)) {
        continue;
      }
      tried.add(address);
      const client = this.client(address);
      try {
        const res = await new Promise<Res>((resolve, reject) => {
          pick(client).call(client, request, callMetadata(this.opts), callOptions(this.opts), (err, out) =>
            err ? reject(toStalwartError(err)) : resolve(out),
          );
        });
        this.leader = address;
        return res;
      } catch (err) {
        last = err;
        if (!(err instanceof StalwartError)) {
          throw err;
        }
        if (err.reason === "NOT_LEADER") {
          queue.unshift(err.metadata.leader ?? "");
        } else if (err.code !== status.UNAVAILABLE) {
          throw err;
        }
      }
    }
    throw last;
  }

  /** Every node, all pages. */
  async listNodes(): Promise<Node[]> {
    return this.allPages(async (pageToken) => {
      const page = await this.call((c) => c.listNodes, { pageSize: 100, pageToken, role: 0 });
      return [page.nodes, page.nextPageToken];
    });
  }

  /** Every job, newest first, all pages. */
  async listJobs(): Promise<Job[]> {
    return this.allPages(async (pageToken) => {
      const page = await this.call((c) => c.listJobs, { pageSize: 100, pageToken, state: 0 });
      return [page.jobs, page.nextPageToken];
    });
  }

  /** Follows opaque page tokens until the last page. */
  private async allPages<T>(fetch: (pageToken: string) => Promise<[T[], string]>): Promise<T[]> {
    const items: T[] = [];
    let pageToken = "";
    do {
      const [page, next] = await fetch(pageToken);
      items.push(...page);
      pageToken = next;
    } while (pageToken);
    return items;
  }

  /**
   * Admit a job. Fields left at zero take the coordinator's defaults (see JobSpec
   * in coordinator.proto). Retrying with the same requestId returns the same job.
   */
  async submitJob(spec: Partial<JobSpec>, requestId: string, jobId = ""): Promise<Job> {
    const res = await this.call((c) => c.createJob, { jobId, spec: JobSpec.fromPartial(spec), requestId });
    return res.job as Job;
  }

  async getJob(jobId: string): Promise<Job> {
    return (await this.call((c) => c.getJob, { jobId })).job as Job;
  }

  /**
   * Poll a job until it finishes or timeoutMs passes; returns its last state.
   * While the coordinators elect a leader (NOT_LEADER with no leader named,
   * UNAVAILABLE) it keeps polling; any other error ends the wait.
   */
  async waitJob(jobId: string, timeoutMs: number, pollMs = 500): Promise<Job> {
    const until = Date.now() + timeoutMs;
    for (;;) {
      let job: Job | undefined;
      try {
        job = await this.getJob(jobId);
      } catch (err) {
        if (!transient(err) || Date.now() > until) {
          throw err;
        }
      }
      if (job !== undefined && (FINISHED_STATES.has(job.state) || Date.now() > until)) {
        return job;
      }
      await new Promise((r) => setTimeout(r, pollMs));
    }
  }

  async getShardMap(jobId: string): Promise<GetShardMapResponse> {
    return this.call((c) => c.getShardMap, { jobId });
  }
}

/** Worth the same call again shortly: no leader elected yet, or a replica down. */
export function transient(err: unknown): boolean {
  return err instanceof StalwartError && (err.reason === "NOT_LEADER" || err.code === status.UNAVAILABLE);
}

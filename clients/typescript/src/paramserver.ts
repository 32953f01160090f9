// Pulling parameters: one stream per shard group's primary (header, then CRC32C
// chunks), then the pieces of the shard map joined into whole tensors.

import { ParamServerServiceClient, type PullRequest } from "./gen/stalwart/v1/paramserver";
import type { ShardPiece, TensorSpec } from "./gen/stalwart/v1/common";
import type { Coordinator } from "./coordinator";
import { toStalwartError } from "./errors";
import { CHANNEL_OPTIONS, callMetadata, callOptions, channelCredentials, type Options } from "./dial";
import { Assembler, type Tensor } from "./tensor";

export interface Pulled {
  /** Version every tensor belongs to. */
  version: number;
  /** Epoch of the replica that answered. */
  epoch: number;
  tensors: Tensor[];
}

/**
 * Pull a job's parameters from one replica. epoch must be the group's epoch
 * (ShardGroup.epoch of GetShardMap): any other is refused. Every chunk's CRC32C
 * is checked; a stream that ends early or out of order is an error.
 */
export async function pull(
  address: string,
  request: Partial<PullRequest> & { jobId: string; epoch: number },
  opts: Options = {},
): Promise<Pulled> {
  const client = new ParamServerServiceClient(address, channelCredentials(opts), CHANNEL_OPTIONS);
  try {
    const full: PullRequest = {
      sinceVersion: -1, minVersion: 0, chunkSize: 0, optimizerState: false, packed: false, ...request,
    };
    const stream = client.pull(full, callMetadata(opts), callOptions(opts));
    let header: { version: number; epoch: number; tensors: TensorSpec[] } | undefined;
    let assembler: Assembler | undefined;
    try {
      for await (const message of stream) {
        if (message.header !== undefined) {
          header = message.header;
          assembler = new Assembler(message.header.tensors);
        } else if (message.chunk !== undefined) {
          if (assembler === undefined) {
            throw new Error("pull stream sent a chunk before its header");
          }
          assembler.add(message.chunk);
        }
      }
    } catch (err) {
      throw toStalwartError(err);
    }
    if (header === undefined || assembler === undefined) {
      throw new Error("pull stream was empty");
    }
    return { version: header.version, epoch: header.epoch, tensors: assembler.finish() };
  } finally {
    client.close();
  }
}

/**
 * Join pieces into whole tensors: a row range is a contiguous run of bytes of
 * dimension 0, so a split tensor is its pieces' bytes in row order.
 */
export function joinPieces(pieces: ShardPiece[], byPiece: Map<string, Tensor>): Map<string, Tensor> {
  const byTensor = new Map<string, ShardPiece[]>();
  for (const p of pieces) {
    byTensor.set(p.tensorName, [...(byTensor.get(p.tensorName) ?? []), p]);
  }
  const out = new Map<string, Tensor>();
  for (const [name, parts] of byTensor) {
    parts.sort((a, b) => a.rowStart - b.rowStart);
    const tensors = parts.map((p) => {
      const t = byPiece.get(p.pieceName);
      if (t === undefined) {
        throw new Error(`shard ${p.shard} sent no piece ${p.pieceName}`);
      }
      return t;
    });
    const first = tensors[0].spec;
    const rows = tensors.reduce((n, t) => n + (t.spec.shape[0] ?? 0), 0);
    const shape = parts.length > 1 ? [rows, ...first.shape.slice(1)] : first.shape;
    out.set(name, {
      spec: { name, dtype: first.dtype, shape },
      data: Buffer.concat(tensors.map((t) => t.data)),
    });
  }
  return out;
}

/** A job's current parameters, whole, from every shard group's primary. */
export async function pullWeights(coordinator: Coordinator, jobId: string, opts: Options = {}) {
  const map = await coordinator.getShardMap(jobId);
  const pieces = map.shardMap?.pieces ?? [];
  if (pieces.length === 0) {
    throw new Error(`job ${jobId}: the shard map has no pieces yet (model not registered)`);
  }
  const pulled = await Promise.all(
    map.groups.map((g) => pull(g.primaryAddress, { jobId, epoch: g.epoch }, opts)),
  );
  const byPiece = new Map<string, Tensor>();
  for (const p of pulled) {
    for (const t of p.tensors) {
      byPiece.set(t.spec.name, t);
    }
  }
  return { versions: pulled.map((p) => p.version), tensors: joinPieces(pieces, byPiece) };
}

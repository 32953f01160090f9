// Channel options shared by every helper: credentials, bearer token, deadlines.

import { type CallOptions, type ChannelCredentials, credentials, Metadata } from "@grpc/grpc-js";

export interface Options {
  /** Channel credentials; plaintext (loopback) when absent. */
  credentials?: ChannelCredentials;
  /** Sent as "authorization: Bearer <token>" on every call when set. */
  token?: string;
  /** Deadline of one unary call, milliseconds (default 30 s). Every call has one. */
  callTimeoutMs?: number;
  /** How long a coordinator call is retried while no replica leads (default 15 s). */
  retryForMs?: number;
}

export const DEFAULT_CALL_TIMEOUT_MS = 30_000;

/**
 * The servers' message limit (8 MiB). A default 4 MiB chunk plus its framing is
 * just over gRPC's default 4 MiB receive limit, so a client must raise it.
 */
export const MAX_MESSAGE_BYTES = 8 * 1024 * 1024;

/** Channel options every helper's client is made with. */
export const CHANNEL_OPTIONS = {
  "grpc.max_receive_message_length": MAX_MESSAGE_BYTES,
  "grpc.max_send_message_length": MAX_MESSAGE_BYTES,
};

export function channelCredentials(opts: Options): ChannelCredentials {
  return opts.credentials ?? credentials.createInsecure();
}

export function callMetadata(opts: Options): Metadata {
  const md = new Metadata();
  if (opts.token) {
    md.set("authorization", `Bearer ${opts.token}`);
  }
  return md;
}

export function callOptions(opts: Options, timeoutMs?: number): Partial<CallOptions> {
  return { deadline: Date.now() + (timeoutMs ?? opts.callTimeoutMs ?? DEFAULT_CALL_TIMEOUT_MS) };
}

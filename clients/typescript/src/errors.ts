// Errors as the servers send them: a gRPC status whose grpc-status-details-bin
// trailer holds a google.rpc.Status with one google.rpc.ErrorInfo (reason,
// domain "stalwart.dev", metadata such as "leader" or "epoch").

import { type Metadata, type ServiceError, status as grpcStatus } from "@grpc/grpc-js";
import { ErrorInfo } from "./gen/google/rpc/error_details";
import { Status } from "./gen/google/rpc/status";

const DETAILS_KEY = "grpc-status-details-bin";
const ERROR_INFO_TYPE = "type.googleapis.com/google.rpc.ErrorInfo";

/** A failed call: its gRPC code and message, and the ErrorInfo reason and metadata. */
export class StalwartError extends Error {
  constructor(
    readonly code: grpcStatus,
    readonly details: string,
    readonly reason: string,
    readonly metadata: Record<string, string>,
  ) {
    super(`${grpcStatus[code] ?? code}${reason ? ` [${reason}]` : ""}: ${details}`);
    this.name = "StalwartError";
  }
}

/** The ErrorInfo in a status's details, or undefined when it carries none. */
export function errorInfo(trailers: Metadata | undefined): ErrorInfo | undefined {
  const raw = trailers?.get(DETAILS_KEY)?.[0];
  if (raw === undefined || typeof raw === "string") {
    return undefined;
  }
  for (const detail of Status.decode(raw).details) {
    if (detail.typeUrl === ERROR_INFO_TYPE) {
      return ErrorInfo.decode(detail.value);
    }
  }
  return undefined;
}

/** Wrap a grpc-js error (anything else is passed through unchanged). */
export function toStalwartError(err: unknown): unknown {
  const e = err as Partial<ServiceError>;
  if (typeof e?.code !== "number" || e.metadata === undefined) {
    return err;
  }
  const info = errorInfo(e.metadata);
  return new StalwartError(e.code, e.details ?? "", info?.reason ?? "", info?.metadata ?? {});
}

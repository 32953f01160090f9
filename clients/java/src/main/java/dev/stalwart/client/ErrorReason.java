package dev.stalwart.client;

import com.google.protobuf.Any;
import com.google.protobuf.InvalidProtocolBufferException;
import com.google.rpc.ErrorInfo;
import io.grpc.StatusRuntimeException;
import io.grpc.protobuf.StatusProto;
import java.util.Map;

/**
 * What a refusal says beyond its status code: the {@code google.rpc.ErrorInfo} of domain
 * {@code stalwart.dev} in the status details (docs/api.md, "Errors"). A status without one
 * has the code's name as its reason and no metadata.
 */
public record ErrorReason(String reason, Map<String, String> metadata) {
  public static final String DOMAIN = "stalwart.dev";

  public static ErrorReason of(StatusRuntimeException error) {
    com.google.rpc.Status details = StatusProto.fromThrowable(error);
    if (details != null) {
      for (Any any : details.getDetailsList()) {
        if (!any.is(ErrorInfo.class)) {
          continue;
        }
        try {
          ErrorInfo info = any.unpack(ErrorInfo.class);
          if (DOMAIN.equals(info.getDomain())) {
            return new ErrorReason(info.getReason(), info.getMetadataMap());
          }
        } catch (InvalidProtocolBufferException e) {
          break; // a malformed detail: fall back to the code
        }
      }
    }
    return new ErrorReason(error.getStatus().getCode().name(), Map.of());
  }
}

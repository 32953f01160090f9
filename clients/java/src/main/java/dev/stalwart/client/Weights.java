package dev.stalwart.client;

import dev.stalwart.v1.GetShardMapResponse;
import dev.stalwart.v1.ParamServerServiceGrpc;
import dev.stalwart.v1.PullHeader;
import dev.stalwart.v1.PullRequest;
import dev.stalwart.v1.PullResponse;
import dev.stalwart.v1.ShardGroup;
import dev.stalwart.v1.ShardPiece;
import dev.stalwart.v1.TensorChunk;
import dev.stalwart.v1.TensorSpec;
import io.grpc.ManagedChannel;
import io.grpc.Status;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Comparator;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;
import java.util.zip.CRC32C;

/** A job's parameters pulled from its paramservers, as raw little-endian bytes. */
public final class Weights {
  /** One tensor: its spec (dtype, shape) and its bytes. */
  public record Tensor(TensorSpec spec, byte[] data) {}

  private Weights() {}

  /**
   * Pull one replica's tensors: a header, then chunks, each chunk's CRC32C checked before
   * it is placed. {@code epoch} must be the group's (from GetShardMap).
   */
  public static Map<String, Tensor> pull(String address, String jobId, long epoch, long deadlineMs) {
    ManagedChannel channel = Channels.open(address);
    try {
      PullRequest request =
          PullRequest.newBuilder().setJobId(jobId).setSinceVersion(-1).setEpoch(epoch).build();
      Iterator<PullResponse> stream =
          ParamServerServiceGrpc.newBlockingStub(channel)
              .withDeadlineAfter(deadlineMs, TimeUnit.MILLISECONDS)
              .pull(request);
      PullHeader header = null;
      List<byte[]> buffers = new ArrayList<>();
      while (stream.hasNext()) {
        PullResponse message = stream.next();
        if (message.hasHeader()) {
          header = message.getHeader();
          for (TensorSpec spec : header.getTensorsList()) {
            buffers.add(new byte[Math.toIntExact(byteSize(spec))]);
          }
        } else if (header == null) {
          throw Status.DATA_LOSS.withDescription("a chunk before the header").asRuntimeException();
        } else {
          place(message.getChunk(), buffers);
        }
      }
      if (header == null) {
        throw Status.DATA_LOSS.withDescription("an empty pull stream").asRuntimeException();
      }
      Map<String, Tensor> out = new HashMap<>();
      for (int i = 0; i < header.getTensorsCount(); i++) {
        TensorSpec spec = header.getTensors(i);
        out.put(spec.getName(), new Tensor(spec, buffers.get(i)));
      }
      return out;
    } finally {
      Channels.close(channel);
    }
  }

  private static void place(TensorChunk chunk, List<byte[]> buffers) {
    byte[] data = chunk.getData().toByteArray();
    CRC32C crc = new CRC32C();
    crc.update(data);
    if ((int) crc.getValue() != chunk.getCrc32C()) {
      throw Status.DATA_LOSS
          .withDescription("CRC32C mismatch in tensor " + chunk.getTensorIndex() + " at " + chunk.getOffset())
          .asRuntimeException();
    }
    if (chunk.getTensorIndex() >= buffers.size()) {
      throw Status.DATA_LOSS.withDescription("a chunk of no announced tensor").asRuntimeException();
    }
    byte[] target = buffers.get(chunk.getTensorIndex());
    if (chunk.getOffset() + data.length > target.length) {
      throw Status.DATA_LOSS.withDescription("a chunk past its tensor's end").asRuntimeException();
    }
    System.arraycopy(data, 0, target, (int) chunk.getOffset(), data.length);
  }

  static long byteSize(TensorSpec spec) {
    long elements = 1;
    for (long dim : spec.getShapeList()) {
      elements *= dim;
    }
    return elements * switch (spec.getDtype()) {
      case DTYPE_FLOAT64, DTYPE_INT64 -> 8;
      case DTYPE_FLOAT32, DTYPE_INT32 -> 4;
      case DTYPE_FLOAT16, DTYPE_BFLOAT16, DTYPE_INT16 -> 2;
      case DTYPE_INT8, DTYPE_UINT8, DTYPE_BOOL -> 1;
      default -> throw new IllegalArgumentException("unknown dtype " + spec.getDtype());
    };
  }

  /** A job's whole tensors: each group's pieces from its primary, joined by row order. */
  public static Map<String, Tensor> pullJob(Coordinator coordinator, String jobId, long deadlineMs) {
    GetShardMapResponse map = coordinator.getShardMap(jobId);
    Map<String, Tensor> pieces = new HashMap<>();
    for (ShardGroup group : map.getGroupsList()) {
      pieces.putAll(pull(group.getPrimaryAddress(), jobId, group.getEpoch(), deadlineMs));
    }
    Map<String, List<ShardPiece>> byTensor = new TreeMap<>();
    for (ShardPiece piece : map.getShardMap().getPiecesList()) {
      byTensor.computeIfAbsent(piece.getTensorName(), k -> new ArrayList<>()).add(piece);
    }
    if (byTensor.isEmpty()) {
      throw new IllegalStateException("job " + jobId + ": the shard map has no pieces yet");
    }
    Map<String, Tensor> out = new TreeMap<>();
    byTensor.forEach((name, parts) -> out.put(name, join(name, parts, pieces)));
    return out;
  }

  /** A row range is a contiguous run of dimension 0's bytes: pieces in row order. */
  private static Tensor join(String name, List<ShardPiece> parts, Map<String, Tensor> pieces) {
    parts.sort(Comparator.comparingLong(ShardPiece::getRowStart));
    ByteArrayOutputStream bytes = new ByteArrayOutputStream();
    TensorSpec first = null;
    long rows = 0;
    for (ShardPiece part : parts) {
      Tensor piece = pieces.get(part.getPieceName());
      if (piece == null) {
        throw new IllegalStateException("shard " + part.getShard() + " sent no " + part.getPieceName());
      }
      first = first == null ? piece.spec() : first;
      rows += piece.spec().getShapeCount() > 0 ? piece.spec().getShape(0) : 0;
      bytes.writeBytes(piece.data());
    }
    TensorSpec.Builder spec = first.toBuilder().setName(name);
    if (parts.size() > 1) {
      spec.setShape(0, rows);
    }
    return new Tensor(spec.build(), bytes.toByteArray());
  }

  /** {"job_id", "tensors": [{"name", "dtype", "shape", "data" (base64)}]} */
  public static void writeJson(Path path, String jobId, Map<String, Tensor> tensors) throws IOException {
    StringBuilder json = new StringBuilder("{\"job_id\":").append(quote(jobId)).append(",\"tensors\":[");
    String separator = "";
    for (Map.Entry<String, Tensor> entry : tensors.entrySet()) {
      TensorSpec spec = entry.getValue().spec();
      json.append(separator)
          .append("{\"name\":").append(quote(entry.getKey()))
          .append(",\"dtype\":").append(quote(spec.getDtype().name()))
          .append(",\"shape\":").append(spec.getShapeList())
          .append(",\"data\":").append(quote(Base64.getEncoder().encodeToString(entry.getValue().data())))
          .append('}');
      separator = ",";
    }
    Files.writeString(path, json.append("]}").toString(), StandardCharsets.UTF_8);
  }

  private static String quote(String text) {
    StringBuilder out = new StringBuilder("\"");
    for (char c : text.toCharArray()) {
      if (c == '"' || c == '\\') {
        out.append('\\').append(c);
      } else if (c < 0x20) {
        out.append(String.format("\\u%04x", (int) c));
      } else {
        out.append(c);
      }
    }
    return out.append('"').toString();
  }
}

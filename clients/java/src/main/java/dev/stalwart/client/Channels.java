package dev.stalwart.client;

import io.grpc.ManagedChannel;
import io.grpc.netty.shaded.io.grpc.netty.NettyChannelBuilder;
import java.util.concurrent.TimeUnit;

/** Plaintext channels as the local cluster serves them (docs/api.md, "Connecting"). */
final class Channels {
  /** The servers' own receive limit: a 4 MiB chunk is a little over gRPC's default 4 MiB. */
  static final int MAX_MESSAGE_BYTES = 8 * 1024 * 1024;

  private Channels() {}

  static ManagedChannel open(String address) {
    return NettyChannelBuilder.forTarget(address)
        .usePlaintext()
        .maxInboundMessageSize(MAX_MESSAGE_BYTES)
        .build();
  }

  static void close(ManagedChannel channel) {
    channel.shutdown();
    try {
      channel.awaitTermination(5, TimeUnit.SECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }
}

package dev.stalwart.ignite;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.ignite.Ignite;
import org.apache.ignite.Ignition;
import org.apache.ignite.configuration.ClientConnectorConfiguration;
import org.apache.ignite.configuration.DataRegionConfiguration;
import org.apache.ignite.configuration.DataStorageConfiguration;
import org.apache.ignite.configuration.IgniteConfiguration;
import org.apache.ignite.spi.communication.tcp.TcpCommunicationSpi;
import org.apache.ignite.spi.discovery.tcp.TcpDiscoverySpi;
import org.apache.ignite.spi.discovery.tcp.ipfinder.vm.TcpDiscoveryVmIpFinder;

/**
 * One in-memory Ignite server node, configured in code (no Spring XML).
 *
 * <p>Everything binds to one address (loopback by default) and every port is
 * given on the command line, so that several test sessions on one machine never
 * join each other's clusters. Persistence is off: Stalwart keeps checkpoints
 * and cluster state in memory here; the durable tier is {@code file://}.
 *
 * <pre>
 * --host ADDR            address to bind (default 127.0.0.1)
 * --client-port N        thin-client connector port (required)
 * --discovery-port N     discovery port of this node (required)
 * --communication-port N communication port of this node (required)
 * --peers LIST           discovery addresses, comma separated, e.g.
 *                        127.0.0.1:47500..47502 (default: this node only)
 * --work-dir DIR         Ignite work directory (required)
 * --name NAME            instance and consistent id (default stalwart-PORT)
 * --region-mb N          max off-heap data region size (default 1024)
 * </pre>
 */
public final class StalwartIgniteNode {
    private StalwartIgniteNode() {
    }

    public static void main(String[] argv) {
        Map<String, String> args = parse(argv);
        String host = args.getOrDefault("host", "127.0.0.1");
        int clientPort = intArg(args, "client-port");
        int discoveryPort = intArg(args, "discovery-port");
        int commPort = intArg(args, "communication-port");
        String workDir = required(args, "work-dir");
        String name = args.getOrDefault("name", "stalwart-" + clientPort);
        long regionBytes = Long.parseLong(args.getOrDefault("region-mb", "1024")) << 20;
        List<String> peers = new ArrayList<>(Arrays.asList(
            args.getOrDefault("peers", host + ":" + discoveryPort).split(",")));

        TcpDiscoveryVmIpFinder ipFinder = new TcpDiscoveryVmIpFinder();
        ipFinder.setAddresses(peers);

        TcpDiscoverySpi discovery = new TcpDiscoverySpi();
        discovery.setLocalAddress(host);
        discovery.setLocalPort(discoveryPort);
        discovery.setLocalPortRange(0);
        discovery.setIpFinder(ipFinder);

        TcpCommunicationSpi communication = new TcpCommunicationSpi();
        communication.setLocalAddress(host);
        communication.setLocalPort(commPort);
        communication.setLocalPortRange(0);

        ClientConnectorConfiguration thinClients = new ClientConnectorConfiguration();
        thinClients.setHost(host);
        thinClients.setPort(clientPort);
        thinClients.setPortRange(0);
        thinClients.setThreadPoolSize(4);

        DataRegionConfiguration region = new DataRegionConfiguration();
        region.setName("default");
        region.setPersistenceEnabled(false);
        region.setInitialSize(Math.min(regionBytes, 64L << 20));
        region.setMaxSize(regionBytes);
        DataStorageConfiguration storage = new DataStorageConfiguration();
        storage.setDefaultDataRegionConfiguration(region);

        IgniteConfiguration cfg = new IgniteConfiguration();
        cfg.setIgniteInstanceName(name);
        cfg.setConsistentId(name);
        cfg.setLocalHost(host);
        cfg.setWorkDirectory(workDir);
        cfg.setDiscoverySpi(discovery);
        cfg.setCommunicationSpi(communication);
        cfg.setClientConnectorConfiguration(thinClients);
        cfg.setConnectorConfiguration(null); // no legacy REST/TCP connector on 11211
        cfg.setDataStorageConfiguration(storage);
        cfg.setPeerClassLoadingEnabled(false);
        cfg.setMetricsLogFrequency(0);
        // Small pools: test machines have few cores and run several services.
        int pool = Math.max(2, Math.min(4, Runtime.getRuntime().availableProcessors()));
        cfg.setPublicThreadPoolSize(pool);
        cfg.setSystemThreadPoolSize(pool);
        cfg.setStripedPoolSize(pool);
        cfg.setServiceThreadPoolSize(2);
        cfg.setQueryThreadPoolSize(2);
        cfg.setAsyncCallbackPoolSize(2);
        cfg.setManagementThreadPoolSize(2);
        cfg.setDataStreamerThreadPoolSize(2);
        cfg.setUtilityCachePoolSize(2);
        cfg.setRebalanceThreadPoolSize(1);
        cfg.setPeerClassLoadingThreadPoolSize(1);

        Ignite ignite = Ignition.start(cfg);
        System.out.println("stalwart-ignite-node ready name=" + name + " client=" + host + ":"
            + clientPort + " servers=" + ignite.cluster().forServers().nodes().size());
        System.out.flush();
        // Ignite's own shutdown hook stops the node on SIGTERM; park the main thread.
        Object forever = new Object();
        synchronized (forever) {
            while (true) {
                try {
                    forever.wait();
                } catch (InterruptedException e) {
                    return;
                }
            }
        }
    }

    private static Map<String, String> parse(String[] argv) {
        Map<String, String> out = new HashMap<>();
        for (int i = 0; i < argv.length; i++) {
            String a = argv[i];
            if (!a.startsWith("--") || i + 1 >= argv.length) {
                usage("bad argument: " + a);
            }
            out.put(a.substring(2), argv[++i]);
        }
        return out;
    }

    private static String required(Map<String, String> args, String key) {
        String v = args.get(key);
        if (v == null || v.isEmpty()) {
            usage("missing --" + key);
        }
        return v;
    }

    private static int intArg(Map<String, String> args, String key) {
        try {
            return Integer.parseInt(required(args, key));
        } catch (NumberFormatException e) {
            usage("--" + key + " must be an integer");
            return -1;
        }
    }

    private static void usage(String why) {
        System.err.println("stalwart-ignite-node: " + why);
        System.exit(2);
    }
}

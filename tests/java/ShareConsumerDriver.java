import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;

import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * Apache Kafka's own KafkaShareConsumer, driven from the command line, for kshare's tests.
 *
 * <pre>
 * java ShareConsumerDriver --bootstrap HOST:PORT --group G --topic T
 *     [--mode implicit|explicit]        acknowledgement mode (default implicit)
 *     [--ack RULES]                     explicit mode: comma-separated VALUE[@COUNT]=ACTION rules, first
 *                                       match wins; VALUE "*" matches any record, @COUNT a delivery count;
 *                                       ACTION accept|release|reject|hold (hold: leave it unacknowledged and
 *                                       stop polling, staying in the group, until the timeout). Default *=accept
 *     [--max-records N]                 stop after N records (0: no limit)
 *     [--timeout-ms MS]                 stop after this long in any case (default 30000)
 *     [--idle-ms MS]                    stop once nothing came for this long after the first record (0: never)
 *     [--poll-ms MS]                    poll timeout (default 500)
 *     [--config KEY=VALUE]...           more consumer configs (e.g. max.poll.records=5)
 *     [--summary true]                  one line per poll instead of one per record (for benchmarks):
 *                                       {"event": "poll", "n": N, "ranges": [[partition, first, last], ...]}
 *                                       (the offsets received, as runs of consecutive offsets)
 *     [--control stdin]                 print {"event": "subscribed"}, wait for a line "go" on stdin
 *                                       before the first poll, and stop at a line "stop" (or end of input)
 * </pre>
 *
 * Prints one JSON object per line on stdout: one per record received
 * ({"partition", "offset", "delivery_count", "key", "value", "ack"}), {"event": "holding"} when a hold
 * rule stops polling, {"event": "commit", "errors": [...]} for failed acknowledgement commits, and
 * {"event": "closed", "received": N} at the end. Keys and values are printed as UTF-8 text.
 */
public final class ShareConsumerDriver {

    private record Rule(String value, Integer count, String action) {
        boolean matches(String v, int deliveryCount) {
            return ("*".equals(value) || value.equals(v)) && (count == null || count == deliveryCount);
        }
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = null, group = null, topic = null, mode = "implicit", ack = "*=accept";
        long maxRecords = 0, timeoutMs = 30_000, idleMs = 0, pollMs = 500;
        boolean summary = false, control = false;
        Properties props = new Properties();
        for (int i = 0; i < args.length; i++) {
            String a = args[i];
            String v = i + 1 < args.length ? args[i + 1] : null;
            if (v == null) {
                usage("missing value for " + a);
            }
            i++;
            switch (a) {
                case "--bootstrap" -> bootstrap = v;
                case "--group" -> group = v;
                case "--topic" -> topic = v;
                case "--mode" -> mode = v;
                case "--ack" -> ack = v;
                case "--max-records" -> maxRecords = Long.parseLong(v);
                case "--timeout-ms" -> timeoutMs = Long.parseLong(v);
                case "--idle-ms" -> idleMs = Long.parseLong(v);
                case "--poll-ms" -> pollMs = Long.parseLong(v);
                case "--summary" -> summary = Boolean.parseBoolean(v);
                case "--control" -> {
                    if (!v.equals("stdin")) {
                        usage("--control takes stdin");
                    }
                    control = true;
                }
                case "--config" -> {
                    int eq = v.indexOf('=');
                    if (eq <= 0) {
                        usage("--config needs KEY=VALUE");
                    }
                    props.put(v.substring(0, eq), v.substring(eq + 1));
                }
                default -> usage("unknown option " + a);
            }
        }
        if (bootstrap == null || group == null || topic == null) {
            usage("--bootstrap, --group and --topic are required");
        }
        if (!mode.equals("implicit") && !mode.equals("explicit")) {
            usage("--mode is implicit or explicit");
        }
        boolean explicit = mode.equals("explicit");
        List<Rule> rules = parseRules(ack);

        props.put("bootstrap.servers", bootstrap);
        props.put("group.id", group);
        props.put("share.acknowledgement.mode", mode);
        props.putIfAbsent("client.id", "java-share-driver");

        long received = 0;
        long start = System.nanoTime();
        long lastRecord = 0;
        boolean holding = false;
        KafkaShareConsumer<byte[], byte[]> consumer =
                new KafkaShareConsumer<>(props, new ByteArrayDeserializer(), new ByteArrayDeserializer());
        java.util.concurrent.atomic.AtomicBoolean stopped = new java.util.concurrent.atomic.AtomicBoolean();
        try {
            consumer.subscribe(List.of(topic));
            if (control) {
                System.out.println("{\"event\": \"subscribed\"}");
                System.out.flush();
                java.io.BufferedReader in = new java.io.BufferedReader(new java.io.InputStreamReader(System.in));
                String line;
                while ((line = in.readLine()) != null && !line.trim().equals("go")) {
                    if (line.trim().equals("stop")) {
                        stopped.set(true);
                        break;
                    }
                }
                if (line == null) {
                    stopped.set(true);
                }
                Thread watcher = new Thread(() -> {
                    try {
                        String l;
                        while ((l = in.readLine()) != null && !l.trim().equals("stop")) {
                            // only "stop" means anything after "go"
                        }
                    } catch (java.io.IOException e) {
                        // input gone: stop as on "stop"
                    }
                    stopped.set(true);
                }, "control");
                watcher.setDaemon(true);
                watcher.start();
                start = System.nanoTime();
            }
            while (!stopped.get() && elapsedMs(start) < timeoutMs && (maxRecords <= 0 || received < maxRecords)) {
                if (holding) {
                    Thread.sleep(Math.min(200, Math.max(1, timeoutMs - elapsedMs(start))));
                    continue;
                }
                if (idleMs > 0 && received > 0 && elapsedMs(lastRecord) > idleMs) {
                    break;
                }
                ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(pollMs));
                if (summary) {
                    if (!records.isEmpty()) {
                        received += records.count();
                        lastRecord = System.nanoTime();
                        System.out.println("{\"event\": \"poll\", \"n\": " + records.count() + ", \"ranges\": "
                                + ranges(records) + "}");
                        System.out.flush();
                    }
                    continue;
                }
                for (ConsumerRecord<byte[], byte[]> r : records) {
                    received++;
                    lastRecord = System.nanoTime();
                    String value = text(r.value());
                    int count = r.deliveryCount().map(Short::intValue).orElse(-1);
                    String action = "implicit";
                    if (explicit) {
                        action = decide(rules, value, count);
                        switch (action) {
                            case "accept" -> consumer.acknowledge(r, AcknowledgeType.ACCEPT);
                            case "release" -> consumer.acknowledge(r, AcknowledgeType.RELEASE);
                            case "reject" -> consumer.acknowledge(r, AcknowledgeType.REJECT);
                            case "hold" -> holding = true;
                            default -> throw new IllegalStateException(action);
                        }
                    }
                    System.out.println("{\"partition\": " + r.partition() + ", \"offset\": " + r.offset()
                            + ", \"delivery_count\": " + count + ", \"key\": " + json(text(r.key()))
                            + ", \"value\": " + json(value) + ", \"ack\": " + json(action) + "}");
                }
                if (holding) {
                    System.out.println("{\"event\": \"holding\"}");
                } else if (explicit && !records.isEmpty()) {
                    report(consumer.commitSync(Duration.ofSeconds(30)));
                }
                System.out.flush();
            }
        } finally {
            if (!holding) {
                try {
                    report(consumer.commitSync(Duration.ofSeconds(30)));
                } catch (RuntimeException e) {
                    System.out.println("{\"event\": \"commit\", \"errors\": [" + json(e.toString()) + "]}");
                }
            }
            consumer.close(Duration.ofSeconds(30));
            System.out.println("{\"event\": \"closed\", \"received\": " + received + "}");
            System.out.flush();
        }
    }

    /** The records' offsets as [partition, first, last] runs of consecutive offsets, in poll order. */
    private static String ranges(ConsumerRecords<byte[], byte[]> records) {
        StringBuilder sb = new StringBuilder("[");
        int partition = -1;
        long first = -1, last = -2;
        for (ConsumerRecord<byte[], byte[]> r : records) {
            if (r.partition() == partition && r.offset() == last + 1) {
                last = r.offset();
                continue;
            }
            if (partition >= 0) {
                sb.append(sb.length() > 1 ? ", " : "").append('[').append(partition).append(", ").append(first)
                        .append(", ").append(last).append(']');
            }
            partition = r.partition();
            first = last = r.offset();
        }
        if (partition >= 0) {
            sb.append(sb.length() > 1 ? ", " : "").append('[').append(partition).append(", ").append(first)
                    .append(", ").append(last).append(']');
        }
        return sb.append(']').toString();
    }

    private static void report(Map<TopicIdPartition, Optional<KafkaException>> result) {
        List<String> errors = new ArrayList<>();
        result.forEach((tp, err) -> err.ifPresent(e -> errors.add(json(tp + ": " + e))));
        if (!errors.isEmpty()) {
            System.out.println("{\"event\": \"commit\", \"errors\": [" + String.join(", ", errors) + "]}");
        }
    }

    private static List<Rule> parseRules(String spec) {
        List<Rule> rules = new ArrayList<>();
        for (String part : spec.split(",")) {
            int eq = part.lastIndexOf('=');
            if (eq <= 0) {
                usage("bad --ack rule " + part);
            }
            String cond = part.substring(0, eq);
            String action = part.substring(eq + 1);
            if (!List.of("accept", "release", "reject", "hold").contains(action)) {
                usage("bad --ack action " + action);
            }
            Integer count = null;
            int at = cond.lastIndexOf('@');
            if (at >= 0) {
                count = Integer.parseInt(cond.substring(at + 1));
                cond = cond.substring(0, at);
            }
            rules.add(new Rule(cond.isEmpty() ? "*" : cond, count, action));
        }
        return rules;
    }

    private static String decide(List<Rule> rules, String value, int count) {
        for (Rule rule : rules) {
            if (rule.matches(value, count)) {
                return rule.action();
            }
        }
        return "accept";
    }

    private static long elapsedMs(long since) {
        return (System.nanoTime() - since) / 1_000_000;
    }

    private static String text(byte[] b) {
        return b == null ? null : new String(b, java.nio.charset.StandardCharsets.UTF_8);
    }

    private static String json(String s) {
        if (s == null) {
            return "null";
        }
        StringBuilder sb = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            switch (c) {
                case '"' -> sb.append("\\\"");
                case '\\' -> sb.append("\\\\");
                case '\n' -> sb.append("\\n");
                case '\r' -> sb.append("\\r");
                case '\t' -> sb.append("\\t");
                default -> {
                    if (c < 0x20) {
                        sb.append(String.format("\\u%04x", (int) c));
                    } else {
                        sb.append(c);
                    }
                }
            }
        }
        return sb.append('"').toString();
    }

    private static void usage(String problem) {
        System.err.println("ShareConsumerDriver: " + problem);
        System.err.println("usage: --bootstrap H:P --group G --topic T [--mode implicit|explicit] [--ack RULES]"
                + " [--max-records N] [--timeout-ms MS] [--idle-ms MS] [--poll-ms MS] [--config K=V]..."
                + " [--summary true] [--control stdin]");
        System.exit(2);
    }
}

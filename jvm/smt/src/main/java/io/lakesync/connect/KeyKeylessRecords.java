package io.lakesync.connect;

import java.util.Map;

import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.connect.connector.ConnectRecord;
import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.data.SchemaBuilder;
import org.apache.kafka.connect.data.Struct;
import org.apache.kafka.connect.transforms.Transformation;

/**
 * Gives a key to every Debezium record that has none, so a compacted topic accepts it.
 *
 * <p>A compacted topic refuses a record without a key: the producer fails and the
 * connector task dies, for every table. Debezium sends two kinds without one:
 * <ul>
 * <li>a TRUNCATE event (op "t"): keyed by its topic, so a table's truncates share one
 *     key and compaction keeps the latest;</li>
 * <li>a row change of a table without a primary key: keyed by a key no other record
 *     has (its LSN, its place among the records of that LSN, and when this task
 *     started, since a COPY and a snapshot give many rows one LSN), so compaction
 *     never drops one. The mirrors recognise the key by its schema name and keep the
 *     table's rows as a multiset (sync/delta/multiset.py).</li>
 * </ul>
 * A tombstone without a key (after a keyless delete) identifies nothing and is dropped.
 * Records that have a key pass through unchanged.
 */
public class KeyKeylessRecords<R extends ConnectRecord<R>> implements Transformation<R> {

    static final Schema TRUNCATE_KEY = SchemaBuilder.struct()
            .name("io.lakesync.TruncateKey")
            .field("truncated_topic", Schema.STRING_SCHEMA)
            .build();

    static final Schema KEYLESS_KEY = SchemaBuilder.struct()
            .name("io.lakesync.KeylessRowKey")
            .field("lsn", Schema.INT64_SCHEMA)
            .field("seq", Schema.INT64_SCHEMA)
            .field("task_started_ms", Schema.INT64_SCHEMA)
            .build();

    private final long started = System.currentTimeMillis();
    private long lastLsn = -1;
    private long seq = 0;

    @Override
    public R apply(R record) {
        if (record.key() != null) {
            return record;
        }
        if (!(record.value() instanceof Struct)) {
            return null;  // a keyless tombstone
        }
        Struct value = (Struct) record.value();
        if ("t".equals(field(value, "op"))) {
            return keyed(record, TRUNCATE_KEY, new Struct(TRUNCATE_KEY).put("truncated_topic", record.topic()));
        }
        Object source = field(value, "source");
        Object lsn = source instanceof Struct ? field((Struct) source, "lsn") : null;
        long position = lsn instanceof Long ? (Long) lsn : 0L;
        seq = position == lastLsn ? seq + 1 : 0;
        lastLsn = position;
        return keyed(record, KEYLESS_KEY, new Struct(KEYLESS_KEY)
                .put("lsn", position).put("seq", seq).put("task_started_ms", started));
    }

    private static Object field(Struct struct, String name) {
        return struct.schema().field(name) == null ? null : struct.get(name);
    }

    private R keyed(R record, Schema keySchema, Struct key) {
        return record.newRecord(record.topic(), record.kafkaPartition(), keySchema, key,
                record.valueSchema(), record.value(), record.timestamp(), record.headers());
    }

    @Override
    public ConfigDef config() {
        return new ConfigDef();
    }

    @Override
    public void configure(Map<String, ?> configs) {
    }

    @Override
    public void close() {
    }
}

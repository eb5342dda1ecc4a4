package io.lakesync.connect;

import java.util.Map;

import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.connect.connector.ConnectRecord;
import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.data.SchemaBuilder;
import org.apache.kafka.connect.data.Struct;
import org.apache.kafka.connect.transforms.Transformation;

/**
 * Gives Debezium's TRUNCATE events a key.
 *
 * <p>Debezium sends a truncate (op "t") with no key, and a compacted topic refuses a
 * record without a key: the producer fails and the connector task dies. This transform
 * keys such records by their topic, so every table's truncates share one key and
 * compaction keeps the latest one. Records that have a key (every row change, and the
 * tombstones after deletes) and records without a value pass through unchanged.
 */
public class KeyTruncateEvents<R extends ConnectRecord<R>> implements Transformation<R> {

    static final Schema KEY_SCHEMA = SchemaBuilder.struct()
            .name("io.lakesync.TruncateKey")
            .field("truncated_topic", Schema.STRING_SCHEMA)
            .build();

    @Override
    public R apply(R record) {
        if (record.key() != null || record.value() == null) {
            return record;
        }
        Struct key = new Struct(KEY_SCHEMA).put("truncated_topic", record.topic());
        return record.newRecord(record.topic(), record.kafkaPartition(), KEY_SCHEMA, key,
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

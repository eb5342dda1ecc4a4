package io.lakesync.connect;

import java.util.Map;

import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.connect.connector.ConnectRecord;
import org.apache.kafka.connect.data.Struct;
import org.apache.kafka.connect.transforms.Transformation;

/**
 * Copies a Debezium change event's {@code source} block into a header named "source", and
 * its {@code transaction} block (with {@code provide.transaction.metadata}) into a header
 * named "transaction".
 *
 * <p>Debezium's Outbox Event Router keeps only the outbox row and the record's headers,
 * so the event's provenance (commit LSN, LSN, transaction id, commit time) would be
 * lost; the ledger needs it to trace every entry to its Postgres transaction, and the
 * transaction block to apply whole source transactions only. Kafka's own HeaderFrom
 * cannot be used: it fails on the tombstone that follows each outbox delete. Records
 * without a value pass through unchanged, and a block a record lacks is not copied.
 */
public class SourceToHeader<R extends ConnectRecord<R>> implements Transformation<R> {

    static final String[] BLOCKS = {"source", "transaction"};

    @Override
    public R apply(R record) {
        if (!(record.value() instanceof Struct)) {
            return record;
        }
        Struct value = (Struct) record.value();
        R copy = null;
        for (String block : BLOCKS) {
            if (value.schema().field(block) == null || value.get(block) == null) {
                continue;
            }
            if (copy == null) {
                copy = record.newRecord(record.topic(), record.kafkaPartition(), record.keySchema(), record.key(),
                        record.valueSchema(), record.value(), record.timestamp(), record.headers().duplicate());
            }
            copy.headers().add(block, value.get(block), value.schema().field(block).schema());
        }
        return copy == null ? record : copy;
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

package io.lakesync.hadoop;

import org.apache.hadoop.fs.LocalFileSystem;

/**
 * {@code fs.file.impl}: Hadoop's checksummed local file system (what Spark and Parquet write
 * through) over {@link NoForkRawLocalFileSystem}.
 */
public class NoForkLocalFileSystem extends LocalFileSystem {
  public NoForkLocalFileSystem() {
    super(new NoForkRawLocalFileSystem());
  }
}

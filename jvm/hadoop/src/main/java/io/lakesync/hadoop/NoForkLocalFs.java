package io.lakesync.hadoop;

import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.ChecksumFs;
import org.apache.hadoop.fs.DelegateToFileSystem;
import org.apache.hadoop.fs.FsServerDefaults;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.local.LocalConfigKeys;

/**
 * {@code fs.AbstractFileSystem.file.impl}: the local file system as {@code FileContext} sees it
 * (Delta's log store commits through it, as do Spark's streaming checkpoints), built as Hadoop's
 * {@code LocalFs} is (checksums over {@code RawLocalFs}), over {@link NoForkRawLocalFileSystem}.
 */
public class NoForkLocalFs extends ChecksumFs {
  public NoForkLocalFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
    super(new Raw(uri, conf));
  }

  /** Hadoop's {@code RawLocalFs}, whose constructor names its file system. */
  static class Raw extends DelegateToFileSystem {
    Raw(URI uri, Configuration conf) throws IOException, URISyntaxException {
      super(uri, new NoForkRawLocalFileSystem(), conf, "file", false);
    }

    @Override
    public int getUriDefaultPort() {
      return -1;  // no default port for file:///
    }

    @Override
    @Deprecated
    public FsServerDefaults getServerDefaults() throws IOException {
      return LocalConfigKeys.getServerDefaults();
    }

    @Override
    public FsServerDefaults getServerDefaults(Path f) throws IOException {
      return LocalConfigKeys.getServerDefaults();
    }

    @Override
    public boolean isValidName(String src) {
      return true;  // any local path
    }
  }
}

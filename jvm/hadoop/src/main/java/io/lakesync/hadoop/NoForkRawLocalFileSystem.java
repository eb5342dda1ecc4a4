package io.lakesync.hadoop;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermissions;

import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's local file system without a process per call.
 *
 * <p>Without Hadoop's native library (not published on any registry), {@link RawLocalFileSystem}
 * runs {@code chmod} for every file it creates and {@code readlink} for the status of each side of
 * a rename: every Parquet file, every Delta commit (a temporary file renamed into place, with its
 * checksum file) and every streaming checkpoint file. Each of those processes is forked from a
 * driver JVM of gigabytes and took 17-25 ms on two busy cores; a Delta commit ran about a dozen.
 * Here the same two operations go through Java's own file API: the permission bits are set with
 * {@code chmod(2)}, and a path that is not a symbolic link (checked with {@code lstat(2)}) has the
 * status {@code getFileStatus} gives, as {@code readlink} printing nothing meant before. A symbolic
 * link is left to Hadoop's own code.
 */
public class NoForkRawLocalFileSystem extends RawLocalFileSystem {

  @Override
  public void setPermission(Path path, FsPermission permission) throws IOException {
    String bits = permission.getUserAction().SYMBOL + permission.getGroupAction().SYMBOL
        + permission.getOtherAction().SYMBOL;  // "rw-r--r--" (a sticky bit is dropped, as for a file)
    Files.setPosixFilePermissions(pathToFile(path).toPath(), PosixFilePermissions.fromString(bits));
  }

  @Override
  public FileStatus getFileLinkStatus(Path path) throws IOException {
    if (Files.isSymbolicLink(pathToFile(path).toPath())) {
      return super.getFileLinkStatus(path);
    }
    return getFileStatus(path);
  }
}

"""The catalog schema (SQLite). Every column is described in docs/format.md.

History is kept by generation ranges: a row is visible as of generation G when
birth_gen <= G < death_gen; live rows have death_gen = LIVE.
"""
from __future__ import annotations

SCHEMA_VERSION = 7  # 2: encoded records (chunks.codec, base_cid), contents.compacted, lineage; 3: lineage.gen;
# 4: versions.nlink; 5: versions.atime_ns, rdev, xattrs and inodes of kind 4; 6: chunks.codec may be 4 (fdelta),
# the tables as in 5; 7: chunks.codec may be 5 (fdelta32), the same tables (upgrade.py migrates versions 1-6)
SAME_TABLES = (5, 6, 7)  # schema versions whose tables are this one's: a consumer reads any of theirs
LIVE = (1 << 62)  # death_gen of rows that are still current
ROOT_INO = 1

KIND_FILE = 1
KIND_DIR = 2
KIND_SYMLINK = 3
KIND_SPECIAL = 4  # a fifo, socket or device node (metadata only: the mode's type bits say which)

SCHEMA = """
CREATE TABLE meta (
  key   TEXT PRIMARY KEY,        -- 'schema_version', 'store_uuid', 'generation', 'next_segment'
  value NOT NULL
) WITHOUT ROWID;

CREATE TABLE generations (
  gen     INTEGER PRIMARY KEY,   -- bumped by every committed change
  time_ns INTEGER NOT NULL,      -- wall clock at commit, ns since the epoch
  op      TEXT NOT NULL          -- the change: create, mkdir, commit, rename, snapshot, ...
);

CREATE TABLE segments (
  seg_id        INTEGER PRIMARY KEY,   -- segments/<seg_id:016d>.seg
  committed_end INTEGER NOT NULL,      -- bytes known durable and covered by a commit, recovery cuts the file here
  created_ns    INTEGER NOT NULL
);

CREATE TABLE chunks (
  cid        INTEGER PRIMARY KEY,      -- small integer handle used by extents
  hash       BLOB NOT NULL UNIQUE,     -- BLAKE3-256 of the raw bytes (32 bytes)
  seg_id     INTEGER NOT NULL,         -- segment holding the record
  offset     INTEGER NOT NULL,         -- byte offset of the record header in the segment
  stored_len INTEGER NOT NULL,         -- payload bytes in the record
  raw_len    INTEGER NOT NULL,         -- bytes of the chunk once decoded
  first_gen  INTEGER NOT NULL,         -- generation whose commit first stored it
  codec      INTEGER NOT NULL DEFAULT 0,  -- how the record encodes it: 0 raw, 1 grouped, 2 XOR, 3 sub delta (codecs.py)
  base_cid   INTEGER                   -- codecs 2, 3: chunks.cid of the base it is a delta against
);
CREATE INDEX chunks_location ON chunks(seg_id, offset);
CREATE INDEX chunks_base ON chunks(base_cid) WHERE base_cid IS NOT NULL;

CREATE TABLE contents (
  content_id INTEGER PRIMARY KEY,      -- one file body, shared by versions that differ only in metadata
  size       INTEGER NOT NULL,         -- logical bytes (sum of extent lengths)
  compacted  INTEGER NOT NULL DEFAULT 0  -- 1: the compactor made this body (or found nothing to do)
);
CREATE INDEX contents_pending ON contents(content_id) WHERE compacted = 0;

CREATE TABLE lineage (                 -- each compacted body's piece of each tensor piece
  tensor_key BLOB NOT NULL,            -- lineage.tensor_key(name, dtype, shape): 16 bytes
  piece      INTEGER NOT NULL,         -- index of the piece within its tensor
  gen        INTEGER NOT NULL,         -- the body's generation (smallest data_gen of its versions)
  cid        INTEGER NOT NULL,         -- chunks.cid of that body's piece
  PRIMARY KEY (tensor_key, piece, gen)
) WITHOUT ROWID;
CREATE INDEX lineage_cid ON lineage(cid);

CREATE TABLE extents (
  content_id  INTEGER NOT NULL,        -- contents.content_id
  file_offset INTEGER NOT NULL,        -- where the extent starts in the file
  length      INTEGER NOT NULL,        -- bytes (the whole chunk, or the hole length)
  cid         INTEGER,                 -- chunks.cid, or NULL for a hole that reads as zeros
  PRIMARY KEY (content_id, file_offset)
) WITHOUT ROWID;
CREATE INDEX extents_cid ON extents(cid) WHERE cid IS NOT NULL;

CREATE TABLE inodes (
  ino       INTEGER PRIMARY KEY AUTOINCREMENT,  -- inode number, never reused, 1 is the root directory
  kind      INTEGER NOT NULL,          -- 1 file, 2 directory, 3 symlink, 4 fifo, socket or device node
  birth_gen INTEGER NOT NULL           -- generation that created it
);

CREATE TABLE versions (
  vid        INTEGER PRIMARY KEY,      -- version id
  ino        INTEGER NOT NULL,         -- inodes.ino
  birth_gen  INTEGER NOT NULL,         -- first generation where this version is current
  death_gen  INTEGER NOT NULL,         -- first generation where it is not (LIVE = 2^62 while current)
  size       INTEGER NOT NULL,         -- st_size
  mode       INTEGER NOT NULL,         -- st_mode, file type bits included
  uid        INTEGER NOT NULL,
  gid        INTEGER NOT NULL,
  mtime_ns   INTEGER NOT NULL,
  ctime_ns   INTEGER NOT NULL,
  content_id INTEGER,                  -- regular files: contents.content_id
  target     BLOB,                     -- symlinks: the link target
  data_gen   INTEGER NOT NULL,         -- generation that wrote this body (metadata-only versions keep the old one)
  nlink      INTEGER NOT NULL DEFAULT 1, -- st_nlink: directories 2 + their subdirectories, others their names
  atime_ns   INTEGER NOT NULL DEFAULT 0, -- st_atime: set by create and utimensat only (reads do not update it)
  rdev       INTEGER NOT NULL DEFAULT 0, -- st_rdev of a device node (Linux dev_t encoding), 0 for all else
  xattrs     BLOB                        -- extended attributes (xattrs.py encoding), NULL when there are none
);
CREATE INDEX versions_ino ON versions(ino, death_gen);
CREATE INDEX versions_content ON versions(content_id) WHERE content_id IS NOT NULL;

CREATE TABLE dentries (
  parent    INTEGER NOT NULL,          -- directory inode
  name      BLOB NOT NULL,             -- entry name, raw bytes
  ino       INTEGER NOT NULL,          -- the inode it names
  birth_gen INTEGER NOT NULL,
  death_gen INTEGER NOT NULL,
  PRIMARY KEY (parent, name, birth_gen)
) WITHOUT ROWID;
CREATE INDEX dentries_ino ON dentries(ino, death_gen);
CREATE INDEX dentries_children ON dentries(parent, death_gen);

CREATE TABLE snapshots (
  name       TEXT PRIMARY KEY,         -- user-given name
  gen        INTEGER NOT NULL,         -- the generation it pins
  created_ns INTEGER NOT NULL
);

"""

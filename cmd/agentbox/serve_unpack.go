package main

import (
	"fmt"

	"github.com/spf13/pflag"

	"github.com/agentbox/agentbox/internal/untar"
)

// unpackFlags bound every tar stream a tenant wrote that the server
// unpacks: image layers of a build (and uploaded build contexts) and
// restored snapshot images. One value goes to both; a zero field keeps
// each one's default.
type unpackFlags struct {
	MaxSizeMB     int64
	MaxFileSizeMB int64
	MaxEntries    int
	MaxRatio      int64
}

func addUnpackFlags(f *pflag.FlagSet, u *unpackFlags) {
	f.Int64Var(&u.MaxSizeMB, "unpack-max-size", 0, "most MiB the files of one tenant-written archive may unpack to, holes of sparse files counted: an image's layers together, a restored snapshot image (0: 10240 for image layers, 524288 for snapshot images, whose microVM disk copies are sparse files of the disk's size; an uploaded build context stays within 4096)")
	f.Int64Var(&u.MaxFileSizeMB, "unpack-max-file-size", 0, "most MiB one file of such an archive may hold, holes counted (0: 10240 for image layers, 262144 for snapshot images)")
	f.IntVar(&u.MaxEntries, "unpack-max-entries", 0, "most entries (files, directories, links) such an archive may hold (0: 1000000 for an image's layers together, 2000000 for snapshot images; an uploaded build context stays within 200000)")
	f.Int64Var(&u.MaxRatio, "unpack-max-ratio", 0, "most bytes a compressed image layer or build context may unpack to per byte received, past its first 64 MiB (0: 100)")
}

// limits is the one value both unpackers get.
func (u unpackFlags) limits() (untar.Limits, error) {
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"--unpack-max-size", u.MaxSizeMB},
		{"--unpack-max-file-size", u.MaxFileSizeMB},
		{"--unpack-max-entries", int64(u.MaxEntries)},
		{"--unpack-max-ratio", u.MaxRatio},
	} {
		if f.v < 0 {
			return untar.Limits{}, fmt.Errorf("%s %d: want 0 (the default) or more", f.name, f.v)
		}
	}
	if u.MaxSizeMB > 1<<43 || u.MaxFileSizeMB > 1<<43 {
		return untar.Limits{}, fmt.Errorf("--unpack-max-size and --unpack-max-file-size: at most %d MiB", int64(1)<<43)
	}
	return untar.Limits{MaxBytes: u.MaxSizeMB << 20, MaxEntryBytes: u.MaxFileSizeMB << 20, MaxEntries: u.MaxEntries, MaxRatio: u.MaxRatio}, nil
}

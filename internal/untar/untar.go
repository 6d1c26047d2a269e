// Package untar owns unpacking a tar stream a tenant wrote (an image
// layer, an uploaded build context, a restored snapshot image) into a
// directory: the limits every such unpack is held to, and the confined
// child of the server's binary that parses the stream and makes the files,
// so that a parser bug a crafted stream triggers yields a process that can
// write beneath its destination and nothing else. What the entries mean
// (OCI whiteouts, a snapshot's overlay layer) stays with each entry
// point's own unpacker, which the child runs as its Work.
package untar

// Limits bound what one tar stream may unpack to. A zero field takes the
// entry point's default (Or); each entry point's refusal names the limit
// it met.
type Limits struct {
	// MaxBytes bounds the files' declared sizes together, holes of sparse
	// files included (a later copy may fill them). Across the layers of
	// one image it is one budget.
	MaxBytes int64
	// MaxEntryBytes bounds one file's declared size, holes included.
	MaxEntryBytes int64
	// MaxEntries bounds the entries (files, directories, links, whiteouts,
	// nodes).
	MaxEntries int
	// MaxRatio bounds the bytes unpacked per byte of a compressed archive
	// as it was received (a gzip bomb), once RatioGrace bytes are
	// unpacked. It applies to image layers and build contexts; snapshot
	// images are never compressed.
	MaxRatio int64
	// RatioGrace is what any archive may unpack to before MaxRatio
	// applies.
	RatioGrace int64
	// MaxPathBytes bounds an entry's name and a link's target.
	MaxPathBytes int
	// MaxPathDepth bounds the directories in an entry's name.
	MaxPathDepth int
	// MaxXattrBytes bounds one entry's extended attributes together,
	// where they are kept (snapshot images; layers drop them all).
	MaxXattrBytes int
}

// Or fills the zero (or negative) fields of l with d's.
func (l Limits) Or(d Limits) Limits {
	l.MaxBytes = or(l.MaxBytes, d.MaxBytes)
	l.MaxEntryBytes = or(l.MaxEntryBytes, d.MaxEntryBytes)
	l.MaxEntries = or(l.MaxEntries, d.MaxEntries)
	l.MaxRatio = or(l.MaxRatio, d.MaxRatio)
	l.RatioGrace = or(l.RatioGrace, d.RatioGrace)
	l.MaxPathBytes = or(l.MaxPathBytes, d.MaxPathBytes)
	l.MaxPathDepth = or(l.MaxPathDepth, d.MaxPathDepth)
	l.MaxXattrBytes = or(l.MaxXattrBytes, d.MaxXattrBytes)
	return l
}

// FileSize is the most one file may hold: MaxEntryBytes or MaxBytes,
// whichever is smaller and set (0: neither is).
func (l Limits) FileSize() int64 {
	switch {
	case l.MaxEntryBytes <= 0:
		return max(l.MaxBytes, 0)
	case l.MaxBytes <= 0:
		return l.MaxEntryBytes
	}
	return min(l.MaxBytes, l.MaxEntryBytes)
}

func or[T int | int64](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// Package faults holds end-to-end tests of what a client sees when a piece
// of the platform fails under it: a sandbox's init, runtime process or VMM
// killed from the host, and a full data disk.
package faults

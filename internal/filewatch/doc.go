// Package filewatch keeps what a program parsed from a small configuration
// file (a token table) in step with the file: it re-reads the file on an
// interval and hands every new content to a loader.
//
// It polls rather than subscribing to file-system events, because the files
// it watches are typically mounted Secrets, which Kubernetes replaces by
// swapping a symlink, and because a read of a few kilobytes once a second
// costs nothing. A change is detected by the content's digest, so a rewrite
// within one modification-time tick, or a swap to a file of the same size,
// is never missed.
//
// It does not parse anything, keep the loaded state, or decide what a
// change means; the loader does.
package filewatch

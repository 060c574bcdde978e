package filewatch

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"time"
)

// DefaultInterval is how often Run re-reads a file: well inside the 5 s in
// which a removed credential must stop working, and cheap for files of a
// few kilobytes.
const DefaultInterval = time.Second

// File is one watched file. Load reads it once; Run keeps re-reading it.
// Load and Run must not be called concurrently: File starts no goroutine of
// its own, and Run runs in the caller's.
type File struct {
	path string
	load func([]byte) error
	// last is the digest of the content last handed to load, whether or
	// not load accepted it, so a broken file is reported once, not once
	// per interval.
	last   [sha256.Size]byte
	loaded bool
}

// New returns a watcher for path whose contents go to load.
func New(path string, load func(content []byte) error) *File {
	return &File{path: path, load: load}
}

// Path is the watched file.
func (f *File) Path() string { return f.path }

// Load reads the file and hands its content to load unless it is the
// content load already saw. It returns a read error, or load's error.
func (f *File) Load() error {
	data, err := os.ReadFile(f.path)
	if err != nil {
		return fmt.Errorf("reading %s: %w", f.path, err)
	}
	sum := sha256.Sum256(data)
	if f.loaded && sum == f.last {
		return nil
	}
	f.last, f.loaded = sum, true
	return f.load(data)
}

// Run calls Load every interval (DefaultInterval if not positive) until
// ctx ends, passing each error to onError; the loader keeps whatever it
// had before a failed load.
func (f *File) Run(ctx context.Context, interval time.Duration, onError func(error)) {
	if interval <= 0 {
		interval = DefaultInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := f.Load(); err != nil {
				onError(err)
			}
		}
	}
}

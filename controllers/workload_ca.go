package controllers

import (
	"fmt"
	"os"
	"sync"
)

// workloadCA is the PEM CA bundle that verifies the workloads' broker, read from a file (the
// operator's --workload-broker-ca-file, typically a mounted Secret that cert-manager rotates). It
// is read again at every use: a rotated bundle reaches each Agent's credentials Secret at the
// Agent's next reconcile, without a restart. A file that is momentarily unreadable (a Secret
// volume being swapped) yields the last bundle read.
type workloadCA struct {
	path string
	mu   sync.Mutex
	last []byte
}

// newWorkloadCA is the bundle of path; nil (no CA) when path is empty.
func newWorkloadCA(path string) *workloadCA {
	if path == "" {
		return nil
	}
	return &workloadCA{path: path}
}

// pem returns the current bundle; nil without a CA.
func (c *workloadCA) pem() ([]byte, error) {
	if c == nil {
		return nil, nil
	}
	raw, err := os.ReadFile(c.path)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil || len(raw) == 0 {
		if c.last != nil {
			return c.last, nil
		}
		if err == nil {
			err = fmt.Errorf("%s is empty", c.path)
		}
		return nil, fmt.Errorf("read the workloads' broker CA: %w", err)
	}
	c.last = raw
	return raw, nil
}

//go:build !unix

package main

import (
	"context"
	"errors"
	"io"
)

// privateCluster needs a Unix: see pgcluster.go.
type privateCluster struct {
	port, maxConnections int
	dir                  string
}

func startPrivateCluster(context.Context, int, io.Writer) (*privateCluster, error) {
	return nil, errors.New("a private cluster needs a Unix")
}

func (c *privateCluster) url() string  { return "" }
func (c *privateCluster) close() error { return nil }

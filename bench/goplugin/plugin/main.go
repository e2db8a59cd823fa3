// Command plugin is the go-plugin echo plugin of the comparison benchmark.
package main

import (
	"context"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"iteron.dev/operator/bench/goplugin"
)

type echo struct{}

func (echo) Start(_ context.Context, in *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error) {
	return in, nil
}

func main() {
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: goplugin.Handshake,
		Plugins:         map[string]plugin.Plugin{goplugin.PluginName: &goplugin.Plugin{Impl: echo{}}},
		GRPCServer:      plugin.DefaultGRPCServer,
	})
}

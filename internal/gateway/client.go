package gateway

import (
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	gatewayv1 "iteron.dev/operator/api/gateway/v1"
)

// Client is a connection to a gateway socket.
type Client struct {
	gatewayv1.GatewayClient
	conn *grpc.ClientConn
}

// Dial returns a client of the gateway listening at socket (the connection
// is made at the first call). There is no transport security: the socket
// never leaves the node, and the server learns who the caller is from the
// kernel (SO_PEERCRED).
func Dial(socket string) (*Client, error) {
	if len(socket) == 0 || socket[0] != '/' {
		return nil, &SocketError{Path: socket, Why: "must be an absolute path"}
	}
	if len(socket) > MaxSocketPath {
		return nil, &SocketError{Path: socket, Why: fmt.Sprintf("is %d bytes; a unix socket path is at most %d", len(socket), MaxSocketPath)}
	}
	conn, err := grpc.NewClient("unix://"+socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxRequestBytes), grpc.MaxCallSendMsgSize(maxRequestBytes)))
	if err != nil {
		return nil, fmt.Errorf("gateway socket %s: %w", socket, err)
	}
	return &Client{GatewayClient: gatewayv1.NewGatewayClient(conn), conn: conn}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

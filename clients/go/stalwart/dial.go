// Package stalwart is a small Go client for Stalwart's gRPC API: dialing with
// a bearer token, reading ErrorInfo reasons, and tensor chunks with CRC32C.
// It shows that everything the Python CLI does is reachable from another
// language through protos/ alone.
package stalwart

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// Options says how to reach a server. The zero value dials plaintext without
// a token, which is what a local cluster without certificates serves.
type Options struct {
	// Token is sent as "authorization: Bearer <token>" on every call when set.
	Token string
	// CAFile turns TLS on: the PEM bundle that signed the server's certificate.
	CAFile string
	// CertFile and KeyFile are this client's certificate for mTLS.
	CertFile, KeyFile string
}

type bearer struct {
	token  string
	secure bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

func (b bearer) RequireTransportSecurity() bool { return b.secure }

// Dial opens a client connection to address (host:port).
func Dial(address string, opts Options) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if opts.CAFile != "" {
		pem, err := os.ReadFile(opts.CAFile)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("no certificate in %s", opts.CAFile)
		}
		cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		if opts.CertFile != "" {
			pair, err := tls.LoadX509KeyPair(opts.CertFile, opts.KeyFile)
			if err != nil {
				return nil, err
			}
			cfg.Certificates = []tls.Certificate{pair}
		}
		creds = credentials.NewTLS(cfg)
	}
	dialOpts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(8 << 20)),
	}
	if opts.Token != "" {
		dialOpts = append(dialOpts, grpc.WithPerRPCCredentials(bearer{opts.Token, opts.CAFile != ""}))
	}
	return grpc.NewClient(address, dialOpts...)
}

// Reason returns the google.rpc.ErrorInfo reason and metadata of a gRPC error
// ("NOT_LEADER", "STALE_EPOCH", ...), so callers branch on it, not on text.
func Reason(err error) (string, map[string]string) {
	st, ok := status.FromError(err)
	if !ok {
		return "", nil
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason(), info.GetMetadata()
		}
	}
	return "", nil
}

// ErrNoLeader is returned when no coordinator answered as leader.
var ErrNoLeader = errors.New("no coordinator leader reachable")

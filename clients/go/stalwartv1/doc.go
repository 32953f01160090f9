// Package stalwartv1 is the Go code generated from protos/stalwart/v1 (package
// stalwart.v1). The *.pb.go files are not committed: run ../generate.sh.
package stalwartv1

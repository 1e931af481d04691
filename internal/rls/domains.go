package rls

import (
	"context"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Domains answers for several services, one per domain (envoyproxy/ratelimit's
// directory of files): a request goes to its domain's service; a domain none
// has is OK, every descriptor without a limit.
type Domains struct {
	pb.UnimplementedRateLimitServiceServer
	by map[string]*Service
}

// NewDomains routes to svcs. Two services of one domain, or two rules of
// one limiter name (they would share their counts), are an error.
func NewDomains(svcs ...*Service) (*Domains, error) {
	d := &Domains{by: map[string]*Service{}}
	names := map[string]string{}
	for _, s := range svcs {
		if _, dup := d.by[s.Domain()]; dup {
			return nil, errAt("domain", "domain '%s' is in two files", s.Domain())
		}
		d.by[s.Domain()] = s
		for _, n := range s.names() {
			if other, dup := names[n]; dup {
				return nil, errAt("rate_limit.name", "the name '%s' is used in domain %s and in domain %s: give one another name", n, other, s.Domain())
			}
			names[n] = s.Domain()
		}
	}
	return d, nil
}

// ShouldRateLimit decides the request by its domain's service.
func (d *Domains) ShouldRateLimit(ctx context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	if s := d.by[req.GetDomain()]; s != nil {
		return s.ShouldRateLimit(ctx, req)
	}
	if len(req.GetDescriptors()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty")
	}
	resp := &pb.RateLimitResponse{OverallCode: pb.RateLimitResponse_OK}
	for range req.Descriptors {
		resp.Statuses = append(resp.Statuses, &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK})
	}
	return resp, nil
}

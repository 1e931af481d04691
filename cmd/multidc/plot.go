package main

import (
	"fmt"
	"image/color"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

var (
	viralColor   = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
	totalColor   = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	flatColor    = color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}
	ceilingColor = color.Black
	demandColor  = color.Gray{Y: 0x90}
)

// writePlot draws the multi-data-centre run: admitted requests per second,
// per data centre and in all, against the ceiling's rate and the viral
// data centre's demand, into a PNG (or SVG, by path's extension).
func writePlot(path string, r *result) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%d data centres, one ceiling (%d per %v, time ÷%g), ledger %v round trip: admitted per second",
		r.c.DCs, r.c.Limit, r.win, r.c.Scale, 2*r.c.Delay)
	p.X.Label.Text = fmt.Sprintf("seconds (real; ÷%g of the trace's time)", r.c.Scale)
	p.Y.Label.Text = "requests per second (log scale; none drawn at 1)"
	p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	p.Add(plotter.NewGrid())
	p.Legend.Top, p.Legend.Left = true, true

	n := len(r.Bins[0])
	sec := r.BinLen.Seconds()
	xy := func(f func(i int) float64) plotter.XYs {
		pts := make(plotter.XYs, n)
		for i := range pts {
			pts[i] = plotter.XY{X: (float64(i) + 0.5) * sec, Y: max(f(i), 1)}
		}
		return pts
	}
	add := func(name string, pts plotter.XYs, col color.Color, width vg.Length, dashed bool) error {
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		l.Color, l.Width = col, width
		if dashed {
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		p.Add(l)
		if name != "" {
			p.Legend.Add(name, l)
		}
		return nil
	}
	ceiling := float64(r.c.Limit) / r.win.Seconds()
	v := r.tr.viral()
	lines := []struct {
		name   string
		pts    plotter.XYs
		col    color.Color
		width  vg.Length
		dashed bool
	}{
		{fmt.Sprintf("ceiling's rate (%d / %v)", r.c.Limit, r.win), xy(func(int) float64 { return ceiling }), ceilingColor, 1.5, true},
		{fmt.Sprintf("dc%d's demand", v), xy(func(i int) float64 {
			t0, t1 := r.BinLen*timeDuration(i), r.BinLen*timeDuration(i+1)
			return (r.tr.cum(v, min(t1, r.tr.total())) - r.tr.cum(v, min(t0, r.tr.total()))) / sec
		}), demandColor, 1, true},
		{"admitted, all data centres", xy(func(i int) float64 {
			s := 0.0
			for dc := range r.Bins {
				s += r.Bins[dc][i]
			}
			return s
		}), totalColor, 2, false},
		{fmt.Sprintf("admitted, dc%d (viral)", v), xy(func(i int) float64 { return r.Bins[v][i] }), viralColor, 1.5, false},
	}
	for _, l := range lines {
		if err := add(l.name, l.pts, l.col, vg.Points(float64(l.width)), l.dashed); err != nil {
			return err
		}
	}
	for dc := range r.Bins {
		if dc == v {
			continue
		}
		name := ""
		if dc == 0 {
			name = fmt.Sprintf("admitted, dc0..dc%d (flat), each", v-1)
		}
		if err := add(name, xy(func(i int) float64 { return r.Bins[dc][i] }), flatColor, vg.Points(0.8), false); err != nil {
			return err
		}
	}
	// The over-demand phase starts here.
	od, err := plotter.NewLine(plotter.XYs{{X: r.ODFrom.Seconds(), Y: 1}, {X: r.ODFrom.Seconds(), Y: r.perSecondMax()}})
	if err != nil {
		return err
	}
	od.Color, od.Dashes = demandColor, []vg.Length{vg.Points(1), vg.Points(2)}
	p.Add(od)
	p.Legend.Add("over-demand phase from here", od)
	p.Y.Min, p.Y.Max = 1, r.perSecondMax()
	return p.Save(11*vg.Inch, 5.5*vg.Inch, path)
}

// perSecondMax is the plot's top: above the admitted, the ceiling and the
// demand, with room for the legend.
func (r *result) perSecondMax() float64 {
	top := max(float64(r.c.Limit)/r.win.Seconds(), r.tr.high)
	for i := range r.Bins[0] {
		s := 0.0
		for dc := range r.Bins {
			s += r.Bins[dc][i]
		}
		top = max(top, s)
	}
	return 8 * top
}

// writeSweepPlot draws the sweep: for each data centres and round trip, the
// ceiling used by the worst window (solid) and the median one (dashed)
// against the ceiling (log scale), with the targets.
func writeSweepPlot(path string, s sweep, cells []cell) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("the ceiling used in the over-demand phase (%v windows): worst window (solid), median (dashed)", s.Window)
	p.X.Label.Text = "ceiling, units per window (log scale)"
	p.Y.Label.Text = "admitted / ceiling, %"
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	p.Add(plotter.NewGrid())
	p.Legend.Top, p.Legend.Left = false, true
	palette := []color.Color{totalColor, viralColor, flatColor, color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
		color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff}, color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}}
	i := 0
	for _, dcs := range s.DCs {
		for _, rtt := range s.RTT {
			var worst, median plotter.XYs
			for _, c := range cells {
				if c.DCs == dcs && c.RTT == rtt {
					worst = append(worst, plotter.XY{X: float64(c.Ceiling), Y: 100 * c.Worst})
					median = append(median, plotter.XY{X: float64(c.Ceiling), Y: 100 * c.Median})
				}
			}
			if len(worst) == 0 {
				continue
			}
			col := palette[i%len(palette)]
			i++
			for k, pts := range []plotter.XYs{worst, median} {
				l, err := plotter.NewLine(pts)
				if err != nil {
					return err
				}
				l.Color, l.Width = col, vg.Points(1.5)
				if k == 1 {
					l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
				} else {
					p.Legend.Add(fmt.Sprintf("%d data centres, %v round trip", dcs, rtt), l)
				}
				p.Add(l)
			}
		}
	}
	lo, hi := float64(s.Ceiling[0]), float64(s.Ceiling[len(s.Ceiling)-1])
	for _, t := range []float64{s.Median, s.Worst} {
		l, err := plotter.NewLine(plotter.XYs{{X: lo, Y: 100 * t}, {X: hi, Y: 100 * t}})
		if err != nil {
			return err
		}
		l.Color, l.Dashes = ceilingColor, []vg.Length{vg.Points(1), vg.Points(2)}
		p.Add(l)
	}
	p.Y.Max = 101
	return p.Save(11*vg.Inch, 5.5*vg.Inch, path)
}

// Package fat is methodcount's fixture: Big reaches 22 methods through two embedded types,
// Small 11 of its own.
package fat

type a struct{}

func (a) A0()  {}
func (a) A1()  {}
func (a) A2()  {}
func (a) A3()  {}
func (a) A4()  {}
func (a) A5()  {}
func (a) A6()  {}
func (a) A7()  {}
func (a) A8()  {}
func (a) A9()  {}
func (a) A10() {}

type b struct{}

func (*b) B0()  {}
func (*b) B1()  {}
func (*b) B2()  {}
func (*b) B3()  {}
func (*b) B4()  {}
func (*b) B5()  {}
func (*b) B6()  {}
func (*b) B7()  {}
func (*b) B8()  {}
func (*b) B9()  {}
func (*b) B10() {}

// Big embeds a and b: 22 methods, all promoted.
type Big struct {
	a
	*b
}

// Small has a's 11 methods through a field, not an embedding: none promoted.
type Small struct {
	inner a
}

// Wide is an interface of 3 methods.
type Wide interface {
	X()
	Y()
	Z()
}

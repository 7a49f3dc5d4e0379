"""The answer quality check: does a changed server still answer well enough?"""

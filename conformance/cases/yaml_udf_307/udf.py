def my_filter(row):
	return True
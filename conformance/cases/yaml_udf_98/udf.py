def my_mapping(row):
	return "good"